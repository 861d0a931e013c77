//! The registry's own checks: entry points defined once in their sources, names unique.

use super::*;

#[test]
fn every_entry_point_is_defined_once_in_its_source() {
    for k in KERNELS {
        match k.source() {
            None => assert!(k.kernel.starts_with("gemm") && k.entries.is_empty(), "{}", k.kernel),
            Some(src) => {
                for e in k.entries {
                    let decl = format!("extern \"C\" __global__ void {e}(");
                    assert_eq!(src.code.matches(&decl).count(), 1, "{} in {}", e, src.path);
                }
            }
        }
        for (f, e) in k.after {
            let other = source(f).expect("a family of the registry");
            let decl = format!("extern \"C\" __global__ void {e}(");
            assert_eq!(other.code.matches(&decl).count(), 1, "{} in {}", e, other.path);
        }
    }
}

#[test]
fn one_twin_per_plan_kernel() {
    assert_eq!(KERNELS.len(), 63);
    let mut names: Vec<_> = KERNELS.iter().map(|k| k.kernel).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 63);
    assert!(KERNELS.iter().all(|k| k.family.is_none() || k.source().is_some()));
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
