//! The reference interpreter's convolution and pooling loops (NHWC, HWIO,
//! TF padding; max-pool gradient to the first maximum, average pools divide
//! by the number of in-bounds taps), and the optimizers' update formulas.

use towers_graph::{Optimizer, Padding};

use super::interp::{binary, ravel, V};

/// Calls `f(n, oh, ow, ih, iw, kh, kw)` for every in-bounds window tap (NHWC, TF padding).
fn windows(x: &[usize], k: [usize; 2], s: [usize; 2], p: Padding, mut f: impl FnMut([usize; 7])) -> [usize; 2] {
    let (oh, ph) = p.out_and_pad(x[1], k[0], s[0]).expect("window fits");
    let (ow, pw) = p.out_and_pad(x[2], k[1], s[1]).expect("window fits");
    for n in 0..x[0] {
        for i in 0..oh {
            for j in 0..ow {
                for a in 0..k[0] {
                    for b in 0..k[1] {
                        let (ih, iw) = ((i * s[0] + a) as i64 - ph as i64, (j * s[1] + b) as i64 - pw as i64);
                        if ih >= 0 && iw >= 0 && (ih as usize) < x[1] && (iw as usize) < x[2] {
                            f([n, i, j, ih as usize, iw as usize, a, b]);
                        }
                    }
                }
            }
        }
    }
    [oh, ow]
}

/// Conv2D and its two gradients: `mode` 0 = forward, 1 = dx, 2 = dfilter.
pub(super) fn conv(x: &V, f: &V, dy: Option<&V>, s: [usize; 2], p: Padding, mode: u8) -> V {
    let (c, o) = (f.shape[2], f.shape[3]);
    let k = [f.shape[0], f.shape[1]];
    let [oh, ow] = windows(&x.shape, k, s, p, |_| {});
    let mut out = match mode {
        0 => V::zeros(&[x.shape[0], oh, ow, o]),
        1 => V::zeros(&x.shape),
        _ => V::zeros(&f.shape),
    };
    windows(&x.shape, k, s, p, |[n, i, j, ih, iw, a, b]| {
        for ci in 0..c {
            for oi in 0..o {
                let xi = ravel(&[n, ih, iw, ci], &x.shape);
                let fi = ravel(&[a, b, ci, oi], &f.shape);
                let yi = ravel(&[n, i, j, oi], &[x.shape[0], oh, ow, o]);
                match mode {
                    0 => out.data[yi] += x.data[xi] * f.data[fi],
                    1 => out.data[xi] += dy.expect("dy").data[yi] * f.data[fi],
                    _ => out.data[fi] += dy.expect("dy").data[yi] * x.data[xi],
                }
            }
        }
    });
    out
}

/// Max/avg pooling and gradients: returns (y, dx) where dx needs `dy`.
pub(super) fn pool(x: &V, dy: Option<&V>, k: [usize; 2], s: [usize; 2], p: Padding, max: bool) -> (V, V) {
    let [oh, ow] = windows(&x.shape, k, s, p, |_| {});
    let c = x.shape[3];
    let yshape = [x.shape[0], oh, ow, c];
    let mut best: Vec<(f64, usize, usize)> = vec![(f64::NEG_INFINITY, 0, 0); yshape.iter().product()];
    windows(&x.shape, k, s, p, |[n, i, j, ih, iw, _, _]| {
        for ci in 0..c {
            let xi = ravel(&[n, ih, iw, ci], &x.shape);
            let b = &mut best[ravel(&[n, i, j, ci], &yshape)];
            if max && x.data[xi] > b.0 {
                *b = (x.data[xi], xi, b.2 + 1);
            } else if !max {
                *b = (if b.2 == 0 { 0.0 } else { b.0 } + x.data[xi], xi, b.2 + 1);
            }
        }
    });
    let y = V::new(&yshape, best.iter().map(|b| if max { b.0 } else { b.0 / b.2 as f64 }).collect());
    let mut dx = V::zeros(&x.shape);
    if let Some(dy) = dy {
        if max {
            for (yi, b) in best.iter().enumerate() {
                dx.data[b.1] += dy.data[yi];
            }
        } else {
            windows(&x.shape, k, s, p, |[n, i, j, ih, iw, _, _]| {
                for ci in 0..c {
                    let yi = ravel(&[n, i, j, ci], &yshape);
                    dx.data[ravel(&[n, ih, iw, ci], &x.shape)] += dy.data[yi] / best[yi].2 as f64;
                }
            });
        }
    }
    (y, dx)
}

/// One optimizer step in TF's formulas; `t` = global_step + 1; `lr` the
/// learning rate the step reads (the `learning_rate` variable).
pub fn apply(opt: &Optimizer, w: &V, slots: &[V], g: &V, t: f64, lr: f64) -> (V, Vec<V>) {
    let zip = |a: &V, b: &V, f: &dyn Fn(f64, f64) -> f64| binary(a, b, f);
    match opt {
        Optimizer::Sgd { .. } => (zip(w, g, &|w, g| w - lr * g), vec![]),
        Optimizer::Momentum { momentum, nesterov, .. } => {
            let m = momentum.0 as f64;
            let a = zip(&slots[0], g, &|a, g| m * a + g);
            let step = if *nesterov { zip(g, &a, &|g, a| g + m * a) } else { a.clone() };
            (zip(w, &step, &|w, s| w - lr * s), vec![a])
        }
        Optimizer::Adam { beta1, beta2, epsilon, .. } => {
            let (b1, b2, eps) = (beta1.0 as f64, beta2.0 as f64, epsilon.0 as f64);
            let lr_t = lr * (1.0 - b2.powf(t)).sqrt() / (1.0 - b1.powf(t));
            let m = zip(&slots[0], g, &|m, g| b1 * m + (1.0 - b1) * g);
            let v = zip(&slots[1], g, &|v, g| b2 * v + (1.0 - b2) * g * g);
            let upd = zip(&m, &v, &|m, v| lr_t * m / (v.sqrt() + eps));
            (zip(w, &upd, &|w, u| w - u), vec![m, v])
        }
        // TF1's ApplyRMSProp: ms = ρ·ms + (1-ρ)·g²; mom = μ·mom + lr·g/sqrt(ms + ε); w -= mom.
        Optimizer::RmsProp { decay, momentum, epsilon, .. } => {
            let (rho, mu, eps) = (decay.0 as f64, momentum.0 as f64, epsilon.0 as f64);
            let ms = zip(&slots[0], g, &|s, g| rho * s + (1.0 - rho) * g * g);
            let step = zip(g, &ms, &|g, s| lr * g / (s + eps).sqrt());
            let mom = zip(&slots[1], &step, &|m, s| mu * m + s);
            (zip(w, &mom, &|w, m| w - m), vec![ms, mom])
        }
        // TF1's ApplyAdagrad: accum += g²; w -= lr·g/sqrt(accum).
        Optimizer::Adagrad { .. } => {
            let a = zip(&slots[0], g, &|a, g| a + g * g);
            let step = zip(g, &a, &|g, a| lr * g / a.sqrt());
            (zip(w, &step, &|w, s| w - s), vec![a])
        }
    }
}
