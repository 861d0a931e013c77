use super::*;
use crate::testutil::{assert_close, numeric_grad, Lcg};

/// Reference from the definition with explicit padded coordinates.
fn naive(p: &PoolGeom, x: &[f32], max: bool) -> Vec<f32> {
    let (oh, pt) = p.out_h();
    let (ow, pl) = p.out_w();
    let mut y = Vec::new();
    for b in 0..p.n {
        for oy in 0..oh {
            for ox in 0..ow {
                for ch in 0..p.c {
                    let (mut m, mut s, mut cnt) = (f32::NEG_INFINITY, 0.0f64, 0);
                    for ky in 0..p.kh {
                        for kx in 0..p.kw {
                            let iy = (oy * p.stride_h + ky) as isize - pt as isize;
                            let ix = (ox * p.stride_w + kx) as isize - pl as isize;
                            if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize {
                                continue;
                            }
                            let v = x[((b * p.h + iy as usize) * p.w + ix as usize) * p.c + ch];
                            m = m.max(v);
                            s += v as f64;
                            cnt += 1;
                        }
                    }
                    y.push(if max { m } else { (s / cnt as f64) as f32 });
                }
            }
        }
    }
    y
}

fn cases() -> Vec<PoolGeom> {
    let mut v = Vec::new();
    for padding in [Padding::Same, Padding::Valid] {
        for &(n, h, w, c, kh, kw, sh, sw) in
            &[(2, 6, 6, 3, 2, 2, 2, 2), (1, 7, 5, 2, 3, 3, 2, 2), (2, 5, 7, 1, 3, 2, 1, 1), (1, 9, 9, 2, 3, 3, 3, 2)]
        {
            v.push(PoolGeom { n, h, w, c, kh, kw, stride_h: sh, stride_w: sw, padding });
        }
    }
    v
}

#[test]
fn forward_matches_reference() {
    let mut r = Lcg::new(21);
    for p in cases() {
        let x = r.vec(p.x_len());
        let mut y = vec![f32::NAN; p.y_len()];
        max_pool(&p, &x, &mut y);
        assert_close(&y, &naive(&p, &x, true), 0.0, "max");
        avg_pool(&p, &x, &mut y);
        assert_close(&y, &naive(&p, &x, false), 1e-6, "avg");
    }
}

/// With `L = sum(pool(x) * g)`, `dL/dx` is the pool gradient with `dy = g`.
/// Random inputs have distinct values, so max pooling is differentiable
/// there and finite differences (step smaller than the value gaps) agree.
#[test]
fn grads_match_finite_differences() {
    let mut r = Lcg::new(22);
    for p in cases() {
        let x = r.vec(p.x_len());
        let g = r.vec(p.y_len());
        for max in [true, false] {
            let loss = |x: &[f32]| -> f64 {
                let mut y = vec![0.0; p.y_len()];
                if max {
                    max_pool(&p, x, &mut y)
                } else {
                    avg_pool(&p, x, &mut y)
                }
                y.iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum()
            };
            let mut y = vec![0.0; p.y_len()];
            max_pool(&p, &x, &mut y);
            let mut dx = vec![f32::NAN; p.x_len()];
            if max {
                max_pool_grad(&p, &x, &y, &g, &mut dx)
            } else {
                avg_pool_grad(&p, &g, &mut dx)
            }
            assert_close(&dx, &numeric_grad(&x, 1e-4, loss), 2e-3, if max { "max grad" } else { "avg grad" });
        }
    }
}

/// The disjoint-window paths (tiling, and stride > window leaving cells
/// uncovered) against the general rule on the same data: the routed
/// gradient is the same, and uncovered cells are zero.
#[test]
fn max_grad_disjoint_windows() {
    let mut r = Lcg::new(23);
    for &(h, w, k, s, padding) in &[
        (6, 8, 2, 2, Padding::Valid),
        (7, 9, 2, 2, Padding::Valid),
        (7, 9, 2, 2, Padding::Same),
        (9, 9, 2, 3, Padding::Valid),
        (9, 8, 3, 3, Padding::Same),
    ] {
        let p = PoolGeom { n: 2, h, w, c: 19, kh: k, kw: k, stride_h: s, stride_w: s, padding };
        let x = r.vec(p.x_len());
        let g = r.vec(p.y_len());
        let mut y = vec![0.0; p.y_len()];
        max_pool(&p, &x, &mut y);
        let mut dx = vec![f32::NAN; p.x_len()];
        max_pool_grad(&p, &x, &y, &g, &mut dx);
        // Reference: each window's first maximal cell gets its dy.
        let (oh, pt) = p.out_h();
        let (ow, pl) = p.out_w();
        let mut want = vec![0.0f32; p.x_len()];
        for b in 0..p.n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for ch in 0..p.c {
                        let o = ((b * oh + oy) * ow + ox) * p.c + ch;
                        let mut done = false;
                        for ky in 0..k {
                            for kx in 0..k {
                                let iy = (oy * s + ky) as isize - pt as isize;
                                let ix = (ox * s + kx) as isize - pl as isize;
                                if done || iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let i = ((b * h + iy as usize) * w + ix as usize) * p.c + ch;
                                if x[i] == y[o] {
                                    want[i] += g[o];
                                    done = true;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(dx, want, "{p:?}");
    }
}

// The plain loops the generic bodies replaced, kept as references: the
// generic bodies must give their bits on every path.

fn max_pool_ref(p: &PoolGeom, x: &[f32], y: &mut [f32]) {
    let (oh, ow, c) = (p.out_h().0, p.out_w().0, p.c);
    p.for_each_window(|b, oy, ox, (ylo, yhi), (xlo, xhi)| {
        let out = &mut y[((b * oh + oy) * ow + ox) * c..][..c];
        out.fill(f32::NEG_INFINITY);
        for iy in ylo..yhi {
            for ix in xlo..xhi {
                let src = &x[((b * p.h + iy) * p.w + ix) * c..][..c];
                for (o, v) in out.iter_mut().zip(src) {
                    *o = if *v > *o { *v } else { *o };
                }
            }
        }
    });
}

fn avg_pool_ref(p: &PoolGeom, x: &[f32], y: &mut [f32]) {
    let (oh, ow, c) = (p.out_h().0, p.out_w().0, p.c);
    p.for_each_window(|b, oy, ox, (ylo, yhi), (xlo, xhi)| {
        let out = &mut y[((b * oh + oy) * ow + ox) * c..][..c];
        out.fill(0.0);
        for iy in ylo..yhi {
            for ix in xlo..xhi {
                let src = &x[((b * p.h + iy) * p.w + ix) * c..][..c];
                for (o, v) in out.iter_mut().zip(src) {
                    *o += *v;
                }
            }
        }
        let inv = 1.0 / ((yhi - ylo) * (xhi - xlo)).max(1) as f32;
        out.iter_mut().for_each(|o| *o *= inv);
    });
}

/// The max-pool gradient on a zero-filled `dx`, routing `y > 0 ? dy : 0`
/// when `relu`.
fn max_pool_grad_ref(p: &PoolGeom, x: &[f32], y: &[f32], dy: &[f32], relu: bool) -> Vec<f32> {
    let mut dx = vec![0.0f32; p.x_len()];
    let (oh, ow, c) = (p.out_h().0, p.out_w().0, p.c);
    p.for_each_window(|b, oy, ox, (ylo, yhi), (xlo, xhi)| {
        let o = ((b * oh + oy) * ow + ox) * c;
        for ch in 0..c {
            let g = if !relu || y[o + ch] > 0.0 { dy[o + ch] } else { 0.0 };
            let mut open = true;
            for iy in ylo..yhi {
                for ix in xlo..xhi {
                    let i = ((b * p.h + iy) * p.w + ix) * c + ch;
                    let hit = open && x[i] == y[o + ch];
                    dx[i] += if hit { g } else { 0.0 };
                    open &= !hit;
                }
            }
        }
    });
    dx
}

fn avg_pool_grad_ref(p: &PoolGeom, dy: &[f32]) -> Vec<f32> {
    let mut dx = vec![0.0f32; p.x_len()];
    let (oh, ow, c) = (p.out_h().0, p.out_w().0, p.c);
    p.for_each_window(|b, oy, ox, (ylo, yhi), (xlo, xhi)| {
        let g = &dy[((b * oh + oy) * ow + ox) * c..][..c];
        let inv = 1.0 / ((yhi - ylo) * (xhi - xlo)).max(1) as f32;
        for iy in ylo..yhi {
            for ix in xlo..xhi {
                let d = &mut dx[((b * p.h + iy) * p.w + ix) * c..][..c];
                for (o, v) in d.iter_mut().zip(g) {
                    *o += *v * inv;
                }
            }
        }
    });
    dx
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|a| a.to_bits()).collect()
}

/// Every kernel on every path this CPU has equals the reference loops bit
/// for bit: ties (coarse values), NaN and signed zeros in the input,
/// channel counts below, at and above every vector width, overlapping and
/// disjoint windows, and empty batches.
#[test]
fn every_path_matches_the_reference_bit_for_bit() {
    use crate::simd::{dispatch_on, SimdPath};
    let mut r = Lcg::new(24);
    let mut geoms = cases();
    for (n, h, w, c, k, s, padding) in [
        (2, 8, 6, 37, 2, 2, Padding::Valid),
        (1, 7, 7, 12, 3, 3, Padding::Same),
        (1, 6, 6, 16, 2, 2, Padding::Valid),
        (1, 5, 5, 17, 3, 2, Padding::Same),
        (2, 4, 4, 8, 2, 1, Padding::Valid),
        (1, 4, 6, 33, 3, 3, Padding::Valid),
        (0, 4, 4, 5, 2, 2, Padding::Valid),
        (1, 4, 4, 0, 2, 2, Padding::Same),
    ] {
        geoms.push(PoolGeom { n, h, w, c, kh: k, kw: k, stride_h: s, stride_w: s, padding });
    }
    for p in geoms {
        // Coarse values: ties inside windows happen; a few NaN and -0.0.
        let mut x: Vec<f32> = r.vec(p.x_len()).iter().map(|v| (v * 3.0).round()).collect();
        for (i, v) in x.iter_mut().enumerate() {
            match i % 23 {
                5 => *v = f32::NAN,
                11 => *v = -0.0,
                _ => {}
            }
        }
        let g = r.vec(p.y_len());
        let mut y = vec![f32::NAN; p.y_len()];
        max_pool_ref(&p, &x, &mut y);
        let mut avg = vec![f32::NAN; p.y_len()];
        avg_pool_ref(&p, &x, &mut avg);
        let disjoint = p.stride_h >= p.kh && p.stride_w >= p.kw;
        let want_dx = max_pool_grad_ref(&p, &x, &y, &g, false);
        let want_relu = max_pool_grad_ref(&p, &x, &y, &g, true);
        let want_avg_dx = avg_pool_grad_ref(&p, &g);
        for path in SimdPath::available() {
            let mut got = vec![f32::NAN; p.y_len()];
            dispatch_on(path, body::MaxPool { p: &p, x: &x, y: &mut got });
            assert_eq!(bits(&got), bits(&y), "max_pool {path} {p:?}");
            dispatch_on(path, body::AvgPool { p: &p, x: &x, y: &mut got });
            assert_eq!(bits(&got), bits(&avg), "avg_pool {path} {p:?}");
            let mut dx = vec![0.0; p.x_len()];
            dispatch_on(path, body::MaxPoolGrad { p: &p, x: &x, y: &y, dy: &g, dx: &mut dx, disjoint, relu: false });
            assert_eq!(bits(&dx), bits(&want_dx), "max_pool_grad {path} {p:?}");
            let mut dx = vec![0.0; p.x_len()];
            dispatch_on(path, body::AvgPoolGrad { p: &p, dy: &g, dx: &mut dx });
            assert_eq!(bits(&dx), bits(&want_avg_dx), "avg_pool_grad {path} {p:?}");
            if disjoint {
                let mut dx = vec![0.0; p.x_len()];
                dispatch_on(path, body::MaxPoolGrad { p: &p, x: &x, y: &y, dy: &g, dx: &mut dx, disjoint, relu: true });
                assert_eq!(bits(&dx), bits(&want_relu), "max_pool_grad relu {path} {p:?}");
            }
        }
        // The public entry points (the active path; `dx` overwritten).
        let mut dx = vec![f32::NAN; p.x_len()];
        max_pool_grad(&p, &x, &y, &g, &mut dx);
        assert_eq!(bits(&dx), bits(&want_dx), "max_pool_grad {p:?}");
        avg_pool_grad(&p, &g, &mut dx);
        assert_eq!(bits(&dx), bits(&want_avg_dx), "avg_pool_grad {p:?}");
    }
}

#[test]
fn max_grad_ties_go_to_first() {
    // One 2x2 window of equal values: TF sends everything to (0, 0).
    let p = PoolGeom { n: 1, h: 2, w: 2, c: 1, kh: 2, kw: 2, stride_h: 2, stride_w: 2, padding: Padding::Valid };
    let mut dx = vec![0.0; 4];
    max_pool_grad(&p, &[1.0; 4], &[1.0], &[3.0], &mut dx);
    assert_eq!(dx, vec![3.0, 0.0, 0.0, 0.0]);
}
