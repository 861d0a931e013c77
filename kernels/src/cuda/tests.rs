//! The sources' own checks: launch entries defined once in their sources, hashes, interning.

use super::*;

#[test]
fn every_launch_entry_is_defined_once_in_its_source() {
    for e in crate::launch::entries::all() {
        let src = source(e.family).expect("a family of the sources");
        let decl = format!("extern \"C\" __global__ void {}(", e.name);
        assert_eq!(src.code.matches(&decl).count(), 1, "{} in {}", e.name, src.path);
    }
}

#[test]
fn sources_are_self_contained_and_hashed() {
    for s in sources() {
        assert!(!s.code.contains("#include"), "{}", s.path);
        assert_eq!(s.hash(), fnv1a64(s.code.as_bytes()));
        assert!(s.code.starts_with(prelude()), "{}: the prelude comes first", s.path);
        assert_eq!(s.body().len() + prelude().len(), s.code.len(), "{}", s.path);
        assert!(!s.body().contains("block_sum(float v"), "{}: the body defines no prelude helper", s.path);
    }
    let a = cache_key(&sources()[0], "sm_90", (13, 0));
    assert_ne!(a, cache_key(&sources()[0], "sm_80", (13, 0)));
    assert_ne!(a, cache_key(&sources()[0], "sm_90", (13, 1)));
    assert_ne!(a, cache_key(&sources()[1], "sm_90", (13, 0)));
}

/// A generated source is made once per expression, found by its family
/// name, holds its entry point once, and differs with the expression.
#[test]
fn fused_sources_are_interned_by_expression() {
    let e: FusedExpr = "ew[$0;sigmoid:0;mul:0:1]".parse().unwrap();
    let g = fused_source(&e);
    assert!(std::ptr::eq(g, fused_source(&e)));
    assert_eq!(source(g.source.family).map(|s| s.code), Some(g.source.code));
    let decl = format!("extern \"C\" __global__ void {}(", g.entry);
    assert_eq!(g.source.code.matches(&decl).count(), 1);
    assert!(g.source.code.starts_with(source("elementwise").unwrap().code));
    let other: FusedExpr = "ew[$0;sigmoid:0;add:0:1]".parse().unwrap();
    assert_ne!(fused_source(&other).source.hash(), g.source.hash());
}

#[test]
fn dims_and_geometry() {
    assert_eq!(Dims4::padded(&[3, 4], 1).unwrap().d, [1, 1, 3, 4]);
    assert_eq!(Dims4::broadcast_strides(&[3, 1, 5]).unwrap().d, [0, 5, 0, 1]);
    assert!(Dims4::padded(&[1; 5], 1).is_none());
    assert_eq!(grid_1d(0), 1);
    assert_eq!(grid_1d(257), 2);
    assert_eq!(grid_1d(usize::MAX / 2), MAX_GRID);
}
