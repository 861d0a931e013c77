//! Tests of the RMSProp and Adagrad updates: TF1's formulas in f64, the
//! fused tower reduction, and bit-identity across every SIMD path.

use super::*;
use crate::testutil::Lcg;

/// Three steps against a plain f64 transcription of TF1's `ApplyRMSProp`
/// (training_ops.cc: `ms += (grad² - ms)·(1 - rho)`;
/// `mom = mom·momentum + grad·lr / sqrt(ms + epsilon)`; `var -= mom`),
/// starting from TF1's slots (ms = 1, mom = 0).
#[test]
fn rmsprop_matches_tf_formula() {
    let (lr, rho, mo, eps) = (0.01f64, 0.9f64, 0.5f64, 1e-10f64);
    let (mut w, mut ms, mut mom) = ([0.5f32, -0.3, 2.0], [1.0f32; 3], [0.0f32; 3]);
    let (mut rw, mut rms, mut rmom) = ([0.5f64, -0.3, 2.0], [1.0f64; 3], [0.0f64; 3]);
    for g in [[0.2f32, -0.7, 0.0], [0.1, 0.4, -3.0], [-0.5, 0.05, 1.0]] {
        apply_rmsprop(&mut w, &mut ms, &mut mom, &g, lr as f32, rho as f32, mo as f32, eps as f32);
        for i in 0..3 {
            let gi = g[i] as f64;
            rms[i] += (gi * gi - rms[i]) * (1.0 - rho);
            rmom[i] = rmom[i] * mo + gi * lr / (rms[i] + eps).sqrt();
            rw[i] -= rmom[i];
        }
    }
    for i in 0..3 {
        assert!((w[i] as f64 - rw[i]).abs() < 1e-6, "w {} vs {}", w[i], rw[i]);
        assert!((ms[i] as f64 - rms[i]).abs() < 1e-6, "ms {} vs {}", ms[i], rms[i]);
    }
}

/// Three steps against TF1's `ApplyAdagrad` (`accum += grad²`;
/// `var -= grad·lr·rsqrt(accum)`), from TF1's accumulator 0.1.
#[test]
fn adagrad_matches_tf_formula() {
    let lr = 0.1f64;
    let (mut w, mut a) = ([0.5f32, -0.3], [0.1f32; 2]);
    let (mut rw, mut ra) = ([0.5f64, -0.3], [0.1f64; 2]);
    for g in [[0.2f32, -0.7], [0.1, 0.4], [-2.0, 0.0]] {
        apply_adagrad(&mut w, &mut a, &g, lr as f32);
        for i in 0..2 {
            let gi = g[i] as f64;
            ra[i] += gi * gi;
            rw[i] -= gi * lr / ra[i].sqrt();
        }
    }
    for i in 0..2 {
        assert!((w[i] as f64 - rw[i]).abs() < 1e-6, "w {} vs {}", w[i], rw[i]);
        assert!((a[i] as f64 - ra[i]).abs() < 1e-6, "accum {} vs {}", a[i], ra[i]);
    }
}

/// The fused tower reduction + update (and the shared `update` dispatch)
/// equals the weighted sum, then the update, bit for bit, across blocks.
#[test]
fn mean_apply_fuses_rmsprop_and_adagrad() {
    let n = MEAN_BLOCK + 5;
    let g0: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.25 - 0.5).collect();
    let g1: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * -0.125 + 0.3).collect();
    let wts = [0.75, 0.25];
    let mut g = vec![0.0; n];
    weighted_sum(&[&g0, &g1], &wts, &mut g);
    for k in [Kernel::ApplyRmsProp { decay: 0.9, momentum: 0.3, epsilon: 1e-10 }, Kernel::ApplyAdagrad {}] {
        let init = |s: f32| (0..n).map(|i| s + (i % 3) as f32 * 0.01).collect::<Vec<f32>>();
        let (mut a, mut b, mut c) = (init(1.0), init(0.1), init(0.2));
        let (mut x, mut y, mut z) = (a.clone(), b.clone(), c.clone());
        match k {
            Kernel::ApplyRmsProp { decay, momentum, epsilon } => {
                apply_rmsprop(&mut x, &mut y, &mut z, &g, 0.01, decay, momentum, epsilon)
            }
            _ => apply_adagrad(&mut x, &mut y, &g, 0.01),
        }
        mean_apply(&[&g0, &g1], &wts, &k, 1, 0.01, &mut [&mut a, &mut b, &mut c]).unwrap();
        assert!(a == x && b == y && c == z, "{}", k.name());
    }
    assert_eq!(update_arity(&Kernel::ApplyRmsProp { decay: 0.9, momentum: 0.0, epsilon: 1e-10 }), Some((3, 1)));
    assert_eq!(update_arity(&Kernel::ApplyAdagrad {}), Some((2, 1)));
    assert_eq!(update_arity(&Kernel::IncrementStep), None);
}

/// Every path this CPU has gives the plain loops' bits, on lengths around
/// every vector width, with NaN, infinities and zeros in the gradient.
#[test]
fn every_path_matches_the_plain_loops_bit_for_bit() {
    use crate::simd::{dispatch_on, SimdPath};
    let mut r = Lcg::new(62);
    for n in [0usize, 1, 3, 4, 7, 8, 15, 16, 17, 33, 100] {
        let mut g = r.vec(n);
        for (i, v) in g.iter_mut().enumerate() {
            match i % 13 {
                3 => *v = 0.0,
                7 => *v = f32::NAN,
                11 => *v = f32::INFINITY,
                _ => {}
            }
        }
        let w0 = r.vec(n);
        let a0: Vec<f32> = r.vec(n).iter().map(|v| v.abs() + 0.1).collect();
        let (lr, omd, mo, eps) = (0.05f32, 1.0f32 - 0.9, 0.9f32, 1e-10f32);
        let (mut rw, mut rms, mut rmom) = (w0.clone(), a0.clone(), a0.clone());
        for (((w, ms), mom), g) in rw.iter_mut().zip(rms.iter_mut()).zip(rmom.iter_mut()).zip(&g) {
            *ms += (*g * *g - *ms) * omd;
            *mom = *mom * mo + (*g * lr) / (*ms + eps).sqrt();
            *w -= *mom;
        }
        let (mut aw, mut aa) = (w0.clone(), a0.clone());
        for ((w, a), g) in aw.iter_mut().zip(aa.iter_mut()).zip(&g) {
            *a += *g * *g;
            *w -= (*g * lr) / a.sqrt();
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for path in SimdPath::available() {
            let (mut w, mut ms, mut mom) = (w0.clone(), a0.clone(), a0.clone());
            dispatch_on(path, body::RmsProp { w: &mut w, ms: &mut ms, mom: &mut mom, g: &g, k: [lr, omd, mo, eps] });
            assert_eq!((bits(&w), bits(&ms), bits(&mom)), (bits(&rw), bits(&rms), bits(&rmom)), "rmsprop {path} n={n}");
            let (mut w, mut a) = (w0.clone(), a0.clone());
            dispatch_on(path, body::Adagrad { w: &mut w, a: &mut a, g: &g, lr });
            assert_eq!((bits(&w), bits(&a)), (bits(&aw), bits(&aa)), "adagrad {path} n={n}");
        }
    }
}
