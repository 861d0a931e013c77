//! "Did you mean" hints: the closest names by edit distance.

/// Levenshtein distance between two strings (by chars).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// A hint such as "; did you mean 'fc/weights'?" naming up to three close names.
pub fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> String {
    let mut scored: Vec<(usize, &str)> = candidates.map(|c| (edit_distance(name, c), c)).collect();
    scored.sort();
    let limit = (name.len() / 3).max(2);
    let near: Vec<String> = scored.iter().filter(|(d, _)| *d <= limit).take(3).map(|(_, c)| format!("'{c}'")).collect();
    if near.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", near.join(" or "))
    }
}
