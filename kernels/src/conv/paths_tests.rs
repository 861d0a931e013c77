//! Tests of the direct and blocked kernels on every SIMD path this CPU has
//! ([`SimdPath::available`], scalar always among them): each against the
//! definition (in f64, with a margin that holds on every path), and every
//! path against scalar **bit for bit**, the invariant the kernels' docs
//! claim. Geometries include channel counts that are not a multiple of any
//! width, SAME borders and empty batches.

use super::{blocked, direct, Algorithm, ConvGeom};
use crate::simd::SimdPath;
use crate::testutil::{assert_close, Lcg};
use crate::window::Padding;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|a| a.to_bits()).collect()
}

/// The three sums straight from the definition, in f64:
/// `y[b,oy,ox,o] = sum x[b, oy*sh-pt+ky, ox*sw-pl+kx, c] * W[ky,kx,c,o]` and
/// its two gradients for `dy`.
fn naive(p: &ConvGeom, x: &[f32], f: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let ((oh, pt), (ow, pl)) = (p.out_h(), p.out_w());
    let (ci, co) = (p.c_in, p.c_out);
    let mut y = vec![0.0f64; p.y_len()];
    let mut dx = vec![0.0f64; p.x_len()];
    let mut df = vec![0.0f64; p.filter_len()];
    for b in 0..p.n {
        for oy in 0..oh {
            for ox in 0..ow {
                for ky in 0..p.kh {
                    for kx in 0..p.kw {
                        let iy = (oy * p.stride_h + ky) as isize - pt as isize;
                        let ix = (ox * p.stride_w + kx) as isize - pl as isize;
                        if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize {
                            continue;
                        }
                        for c in 0..ci {
                            let xi = ((b * p.h + iy as usize) * p.w + ix as usize) * ci + c;
                            for o in 0..co {
                                let (yi, fi) =
                                    (((b * oh + oy) * ow + ox) * co + o, ((ky * p.kw + kx) * ci + c) * co + o);
                                y[yi] += x[xi] as f64 * f[fi] as f64;
                                dx[xi] += dy[yi] as f64 * f[fi] as f64;
                                df[fi] += x[xi] as f64 * dy[yi] as f64;
                            }
                        }
                    }
                }
            }
        }
    }
    let f32s = |v: Vec<f64>| v.into_iter().map(|a| a as f32).collect::<Vec<_>>();
    (f32s(y), f32s(dx), f32s(df))
}

/// `relu(conv + bias)` from the definition's `y`.
fn bias_relu(y: &[f32], bias: &[f32]) -> Vec<f32> {
    y.iter().enumerate().map(|(i, v)| (v + bias[i % bias.len()]).max(0.0)).collect()
}

/// Random direct geometries (1-4 input channels, strides 1-3, SAME and
/// VALID, filters wider than the input, 1-40 output channels).
fn direct_geometries(r: &mut Lcg, count: usize) -> Vec<ConvGeom> {
    let mut v = Vec::new();
    while v.len() < count {
        let p = ConvGeom {
            n: 1 + r.below(2),
            h: 1 + r.below(11),
            w: 1 + r.below(11),
            c_in: 1 + r.below(4),
            kh: 1 + r.below(6),
            kw: 1 + r.below(6),
            c_out: 1 + r.below(40),
            stride_h: 1 + r.below(3),
            stride_w: 1 + r.below(3),
            padding: if r.below(2) == 0 { Padding::Same } else { Padding::Valid },
        };
        if direct::fits(&p) && !p.is_pointwise() {
            v.push(p);
        }
    }
    // The unit-step forms (c_in 1, stride 1, kw 3 and 5) on rows longer
    // than any register block.
    for (kw, padding) in [(3, Padding::Valid), (5, Padding::Same), (5, Padding::Valid)] {
        let c_out = 1 + r.below(20);
        v.push(ConvGeom { n: 2, h: 9, w: 30, c_in: 1, kh: 3, kw, c_out, stride_h: 1, stride_w: 1, padding });
    }
    v
}

/// Random geometries the dispatcher sends to the blocked kernels: SAME
/// and VALID, filters up to 5x5 (also wider than the input under SAME),
/// 1-32 output channels (one to four AVX2 vectors, with tails).
fn blocked_geometries(r: &mut Lcg, count: usize) -> Vec<ConvGeom> {
    let mut v = Vec::new();
    while v.len() < count {
        let p = ConvGeom {
            n: 1 + r.below(2),
            h: 1 + r.below(14),
            w: 1 + r.below(14),
            c_in: 12 + r.below(5),
            kh: 1 + r.below(5),
            kw: 1 + r.below(5),
            c_out: 1 + r.below(32),
            stride_h: 1,
            stride_w: 1,
            padding: if r.below(2) == 0 { Padding::Same } else { Padding::Valid },
        };
        if p.algorithm() == Algorithm::Blocked {
            v.push(p);
        }
    }
    v
}

#[test]
fn direct_kernels_match_the_definition_and_agree_bitwise_on_every_path() {
    let mut r = Lcg::new(171);
    for p in direct_geometries(&mut r, 60) {
        let (x, f, dy, bias) = (r.vec(p.x_len()), r.vec(p.filter_len()), r.vec(p.y_len()), r.vec(p.c_out));
        let (want_y, _, want_df) = naive(&p, &x, &f, &dy);
        let want_yb = bias_relu(&want_y, &bias);
        let mut first: Option<(SimdPath, [Vec<u32>; 3])> = None;
        for path in SimdPath::available() {
            let mut y = vec![f32::NAN; p.y_len()];
            direct::conv2d_on(path, &p, &x, &f, None, &mut y);
            assert_close(&y, &want_y, 1e-5, &format!("{path} forward {p:?}"));
            let mut yb = vec![f32::NAN; p.y_len()];
            direct::conv2d_on(path, &p, &x, &f, Some((&bias, true)), &mut yb);
            assert_close(&yb, &want_yb, 1e-5, &format!("{path} forward+bias+relu {p:?}"));
            let mut df = vec![f32::NAN; p.filter_len()];
            direct::conv2d_backprop_filter_on(path, &p, &x, &dy, &mut df);
            assert_close(&df, &want_df, 1e-4, &format!("{path} filter grad {p:?}"));
            let got = [bits(&y), bits(&yb), bits(&df)];
            match &first {
                None => first = Some((path, got)),
                Some((p0, want)) => {
                    for (i, name) in ["forward", "forward+bias+relu", "filter grad"].iter().enumerate() {
                        assert_eq!(got[i], want[i], "{name} {path} vs {p0} {p:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn blocked_kernels_match_the_definition_and_agree_bitwise_on_every_path() {
    let mut r = Lcg::new(191);
    for p in blocked_geometries(&mut r, 50) {
        let (x, f, dy, bias) = (r.vec(p.x_len()), r.vec(p.filter_len()), r.vec(p.y_len()), r.vec(p.c_out));
        let (want_y, want_dx, want_df) = naive(&p, &x, &f, &dy);
        let want_yb = bias_relu(&want_y, &bias);
        let mut ws = vec![f32::NAN; p.workspace_len()];
        let mut first: Option<(SimdPath, [Vec<u32>; 4])> = None;
        for path in SimdPath::available() {
            let mut y = vec![f32::NAN; p.y_len()];
            ws.fill(f32::NAN);
            blocked::conv2d_on(path, &p, &x, &f, None, &mut y, &mut ws);
            assert_close(&y, &want_y, 1e-5, &format!("{path} forward {p:?}"));
            let mut yb = vec![f32::NAN; p.y_len()];
            ws.fill(f32::NAN);
            blocked::conv2d_on(path, &p, &x, &f, Some((&bias, true)), &mut yb, &mut ws);
            assert_close(&yb, &want_yb, 1e-5, &format!("{path} forward+bias+relu {p:?}"));
            let mut dx = vec![f32::NAN; p.x_len()];
            ws.fill(f32::NAN);
            blocked::conv2d_backprop_input_on(path, &p, &dy, &f, &mut dx, &mut ws);
            assert_close(&dx, &want_dx, 1e-5, &format!("{path} input grad {p:?}"));
            let mut df = vec![f32::NAN; p.filter_len()];
            ws.fill(f32::NAN);
            blocked::conv2d_backprop_filter_on(path, &p, &x, &dy, &mut df, &mut ws);
            assert_close(&df, &want_df, 1e-4, &format!("{path} filter grad {p:?}"));
            let got = [bits(&y), bits(&yb), bits(&dx), bits(&df)];
            match &first {
                None => first = Some((path, got)),
                Some((p0, want)) => {
                    for (i, name) in ["forward", "forward+bias+relu", "input grad", "filter grad"].iter().enumerate() {
                        assert_eq!(got[i], want[i], "{name} {path} vs {p0} {p:?}");
                    }
                }
            }
        }
    }
}

/// The seed convnet's layers take the kernels these tests cover, and the
/// second layer's VALID input gradient the column-row form; the seed's
/// geometry (batch cut to 3) agrees bit for bit on every path.
#[test]
fn seed_layers_agree_bitwise_on_every_path() {
    let geom = |h, c_in, k, c_out| ConvGeom {
        n: 3,
        h,
        w: h,
        c_in,
        kh: k,
        kw: k,
        c_out,
        stride_h: 1,
        stride_w: 1,
        padding: Padding::Valid,
    };
    let (first, second) = (geom(28, 1, 5, 12), geom(12, 12, 3, 24));
    assert_eq!(first.algorithm(), Algorithm::Direct);
    assert_eq!(second.algorithm(), Algorithm::Blocked);
    assert!(super::blocked_dx::fits(&second));
    let mut r = Lcg::new(193);
    for p in [first, second] {
        let (x, f, dy) = (r.vec(p.x_len()), r.vec(p.filter_len()), r.vec(p.y_len()));
        let mut ws = vec![0.0; p.workspace_len()];
        let run = |path: SimdPath, ws: &mut [f32]| {
            let mut y = vec![f32::NAN; p.y_len()];
            let mut dx = vec![f32::NAN; p.x_len()];
            let mut df = vec![f32::NAN; p.filter_len()];
            if p.algorithm() == Algorithm::Blocked {
                blocked::conv2d_on(path, &p, &x, &f, None, &mut y, ws);
                blocked::conv2d_backprop_input_on(path, &p, &dy, &f, &mut dx, ws);
                blocked::conv2d_backprop_filter_on(path, &p, &x, &dy, &mut df, ws);
            } else {
                direct::conv2d_on(path, &p, &x, &f, None, &mut y);
                direct::conv2d_backprop_filter_on(path, &p, &x, &dy, &mut df);
            }
            (bits(&y), bits(&dx), bits(&df))
        };
        let want = run(SimdPath::Scalar, &mut ws);
        for path in SimdPath::available() {
            assert_eq!(run(path, &mut ws), want, "{path} vs scalar {p:?}");
        }
    }
}

/// Empty batches and empty outputs: nothing written by the forward pass,
/// a zero filter gradient, on every path.
#[test]
fn empty_batches_on_every_path() {
    let p = ConvGeom {
        n: 0,
        h: 6,
        w: 6,
        c_in: 1,
        kh: 3,
        kw: 3,
        c_out: 20,
        stride_h: 1,
        stride_w: 1,
        padding: Padding::Same,
    };
    let f = vec![1.0; p.filter_len()];
    for path in SimdPath::available() {
        let mut y: Vec<f32> = vec![];
        direct::conv2d_on(path, &p, &[], &f, Some((&[0.5; 20], true)), &mut y);
        let mut df = vec![f32::NAN; p.filter_len()];
        direct::conv2d_backprop_filter_on(path, &p, &[], &[], &mut df);
        assert!(df.iter().all(|&v| v == 0.0), "{path}");
    }
    // The public entry points, whatever the algorithm, on the active path.
    for c_in in [1, 12] {
        let p = ConvGeom { c_in, ..p };
        let f = vec![1.0; p.filter_len()];
        let mut ws = vec![0.0; p.workspace_len()];
        super::conv2d(&p, &[], &f, &mut [], &mut ws);
        super::conv2d_backprop_input(&p, &[], &f, &mut [], &mut ws);
        let mut df = vec![f32::NAN; p.filter_len()];
        super::conv2d_backprop_filter(&p, &[], &[], &mut df, &mut ws);
        assert!(df.iter().all(|&v| v == 0.0), "c_in {c_in}");
    }
}
