//! Dropout (Philox masks), batch norm, and the variable updates: moving
//! averages, optimizers, the fused tower reduction, the multi-tensor
//! update, the step counter; each launched as the CUDA backend lowers it.

use towers_kernels::Kernel;

use crate::cpu;
use crate::harness::{Dev, Gpu, Operand, Report, Rng};

pub(crate) fn dropout(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    // Masks and outputs, from element 0 (the kernels' dropout) and at an
    // offset (a tower's rows). The mask of element i is Philox's word for
    // (seed, step, i), bit for bit the CPU's (whose Philox is held to
    // Random123's known answers in kernels/src/random.rs).
    for (len, keep, seed, step, offset) in [
        (40_000usize, 0.75f32, 7u64, 3u64, 0usize),
        (10_001, 0.5, 0x1234_5678_9abc_def0, 1 << 33, 5),
        (4096, 0.9, 42, 0, 123_457),
        (100, 1.0, 1, 1, 3),
        (100, 0.0, 1, 1, 0),
    ] {
        let x = rng.vec(len, -1.0, 1.0);
        let (dx, y, m) = (g.up(&x), g.up(&vec![0f32; len]), g.up(&vec![0f32; len]));
        // The step number lives in device memory (what a CUDA graph replays).
        let k = Kernel::Dropout { keep_prob: keep, seed, elem_offset: offset };
        g.run_at(&k, &[dx.of(len)], &[y.of(len), m.of(len)], None, step);
        let (mut wy, mut wm) = (vec![0f32; len], vec![0f32; len]);
        if offset == 0 {
            cpu::dropout::dropout(&x, keep, seed, step, 0, &mut wy, &mut wm);
        } else {
            cpu::dropout_at(&x, keep, seed, step, offset, &mut wy, &mut wm);
        }
        let case = format!("n {len} keep {keep} offset {offset} step {step}");
        r.f32("dropout", format!("{case}: mask"), &g.down(&m, len), &wm, None);
        r.f32("dropout", format!("{case}: y"), &g.down(&y, len), &wy, None);
    }
}

pub(crate) fn batchnorm(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    let eps = 1e-3f32;
    for (rows, c) in [(8usize, 3usize), (256 * 14 * 14 / 4, 32), (1000, 256), (1, 4)] {
        let len = rows * c;
        let x: Vec<f32> = rng.vec(len, -2.0, 3.0);
        let gamma = rng.vec(c, 0.5, 1.5);
        let beta = rng.vec(c, -0.5, 0.5);
        let (dx, dg, db) = (g.up(&x), g.up(&gamma), g.up(&beta));
        let z = || g.up(&vec![0f32; c]);
        let (mean, inv_std, var, y) = (z(), z(), z(), g.up(&vec![0f32; len]));
        let k = Kernel::BatchNormTrain { channels: c, epsilon: eps };
        g.run(&k, &[dx.of(len), dg.of(c), db.of(c)], &[y.of(len), mean.of(c), inv_std.of(c), var.of(c)], None);
        let mut w = [vec![0f32; len], vec![0f32; c], vec![0f32; c], vec![0f32; c]];
        cpu::batch_norm_train(&x, &gamma, &beta, eps, &mut w);
        let case = format!("[{rows}, {c}]");
        r.f32("batch_norm_train", format!("{case} y"), &g.down(&y, len), &w[0], Some(1e-4));
        r.f32("batch_norm_train", format!("{case} mean"), &g.down(&mean, c), &w[1], Some(1e-5));
        r.f32("batch_norm_train", format!("{case} inv_std"), &g.down(&inv_std, c), &w[2], Some(1e-4));
        r.f32("batch_norm_train", format!("{case} var (unbiased)"), &g.down(&var, c), &w[3], Some(1e-4));

        // Infer, from moving statistics.
        let mm = rng.vec(c, -0.5, 0.5);
        let mv = rng.vec(c, 0.5, 2.0);
        let (dmm, dmv) = (g.up(&mm), g.up(&mv));
        let (om, oi, ov) = (z(), z(), z());
        let k = Kernel::BatchNormInfer { channels: c, epsilon: eps };
        let ins = [dx.of(len), dg.of(c), db.of(c), dmm.of(c), dmv.of(c)];
        g.run(&k, &ins, &[y.of(len), om.of(c), oi.of(c), ov.of(c)], None);
        let mut wy = vec![0f32; len];
        let (mut w1, mut w2, mut w3) = (vec![0f32; c], vec![0f32; c], vec![0f32; c]);
        cpu::batchnorm::batch_norm_infer(&x, &gamma, &beta, &mm, &mv, eps, &mut wy, &mut w1, &mut w2, &mut w3);
        let wi: Vec<f32> = mv.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
        r.f32("batch_norm_infer", format!("{case} y"), &g.down(&y, len), &wy, Some(1e-6));
        r.f32(
            "batch_norm_infer",
            format!("{case} mean, var"),
            &[g.down(&om, c), g.down(&ov, c)].concat(),
            &[mm.clone(), mv.clone()].concat(),
            None,
        );
        r.f32("batch_norm_infer", format!("{case} inv_std"), &g.down(&oi, c), &wi, None);

        // Grad, from the CPU's saved statistics.
        let gy = rng.vec(len, -1.0, 1.0);
        let (dgy, dm, dis) = (g.up(&gy), g.up(&w[1]), g.up(&w[2]));
        let (dgam, dbet, dxo) = (z(), z(), g.up(&vec![0f32; len]));
        let ins = [dgy.of(len), dx.of(len), dg.of(c), dm.of(c), dis.of(c)];
        g.run(&Kernel::BatchNormGrad { channels: c }, &ins, &[dxo.of(len), dgam.of(c), dbet.of(c)], None);
        let (mut wdx, mut wdg, mut wdb) = (vec![0f32; len], vec![0f32; c], vec![0f32; c]);
        cpu::batchnorm::batch_norm_grad(&gy, &x, &gamma, &w[1], &w[2], &mut wdx, &mut wdg, &mut wdb);
        r.f32("batch_norm_grad", format!("{case} dgamma"), &g.down(&dgam, c), &wdg, Some(1e-4));
        r.f32("batch_norm_grad", format!("{case} dbeta"), &g.down(&dbet, c), &wdb, Some(1e-4));
        r.f32("batch_norm_grad", format!("{case} dx"), &g.down(&dxo, len), &wdx, Some(1e-4));
    }
}

pub(crate) fn optim(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    use cpu::{misc, optim};
    let len = 50_003;
    let w0 = rng.vec(len, -1.0, 1.0);
    let grad = rng.vec(len, -1.0, 1.0);
    let s1 = rng.vec(len, -0.1, 0.1);
    let s2 = rng.vec(len, 0.0, 0.01);
    let dgr = g.up(&grad);

    // AssignMovingAverage
    let v = g.up(&w0);
    g.run(&Kernel::AssignMovingAverage { decay: 0.99 }, &[dgr.of(len)], &[v.of(len)], None);
    let want: Vec<f32> = w0.iter().zip(&grad).map(|(v, x)| *v * 0.99 + *x * (1.0 - 0.99)).collect();
    r.f32("assign_moving_average", "decay 0.99", &g.down(&v, len), &want, None);

    // The optimizers, plain and fused with the tower reduction (3 towers).
    let towers: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(len, -1.0, 1.0)).collect();
    let weights = [0.375f32, 0.375, 0.25];
    let tdev: Vec<Dev<f32>> = towers.iter().map(|t| g.up(t)).collect();
    let mut mean_g = vec![0f32; len];
    misc::weighted_sum(&towers.iter().map(|t| t.as_slice()).collect::<Vec<_>>(), &weights, &mut mean_g);
    let step = 4i32; // global_step: the update uses t = 5
    let dstep = g.up(&[step]);
    // The learning rate is a device scalar the update reads each step.
    let (lr_sgd, lr_mom, lr_adam) = (g.up(&[0.1f32]), g.up(&[0.05f32]), g.up(&[0.001f32]));

    for fused in [false, true] {
        let gsrc: &[f32] = if fused { &mean_g } else { &grad };
        let tag = |s: &str| if fused { format!("{s}, 3 towers fused") } else { s.to_string() };
        // The update alone, or inside MeanApply over the towers' gradients;
        // `rest`: its inputs after the gradient.
        let run = |apply: Kernel, rest: &[(u64, usize)], outs: &[(u64, usize)]| -> &'static str {
            let mut ins = if fused { tdev.iter().map(|t| t.of(len)).collect() } else { vec![dgr.of(len)] };
            ins.extend_from_slice(rest);
            let k = if fused { Kernel::MeanApply { weights: weights.to_vec(), apply: Box::new(apply) } } else { apply };
            g.run(&k, &ins, outs, None);
            k.name()
        };

        let w = g.up(&w0);
        let name = run(Kernel::ApplyGradientDescent {}, &[lr_sgd.of(1)], &[w.of(len)]);
        let mut want = w0.clone();
        optim::apply_gradient_descent(&mut want, gsrc, 0.1);
        r.f32(name, tag("gradient descent"), &g.down(&w, len), &want, None);

        for nesterov in [false, true] {
            let (w, acc) = (g.up(&w0), g.up(&s1));
            let k = Kernel::ApplyMomentum { momentum: 0.9, nesterov };
            let name = run(k, &[lr_mom.of(1)], &[w.of(len), acc.of(len)]);
            let (mut ww, mut wa) = (w0.clone(), s1.clone());
            optim::apply_momentum(&mut ww, &mut wa, gsrc, 0.05, 0.9, nesterov);
            let case = tag(if nesterov { "momentum, nesterov" } else { "momentum" });
            r.f32(name, format!("{case}: w"), &g.down(&w, len), &ww, None);
            r.f32(name, format!("{case}: accum"), &g.down(&acc, len), &wa, None);
        }

        let (w, m, vv) = (g.up(&w0), g.up(&s1), g.up(&s2));
        let k = Kernel::ApplyAdam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 };
        let name = run(k, &[dstep.of(1), lr_adam.of(1)], &[w.of(len), m.of(len), vv.of(len)]);
        let (mut ww, mut wm, mut wv) = (w0.clone(), s1.clone(), s2.clone());
        optim::apply_adam(&mut ww, &mut wm, &mut wv, gsrc, 0.001, 0.9, 0.999, 1e-8, step as u64 + 1);
        r.f32(name, tag("adam step 5: w"), &g.down(&w, len), &ww, None);
        r.f32(name, tag("adam step 5: m"), &g.down(&m, len), &wm, None);
        r.f32(name, tag("adam step 5: v"), &g.down(&vv, len), &wv, None);

        // RMSProp (ms from s2 >= 0, mom from s1) and Adagrad (accum from s2), issue 22.
        let (w, ms, mom) = (g.up(&w0), g.up(&s2), g.up(&s1));
        let k = Kernel::ApplyRmsProp { decay: 0.9, momentum: 0.5, epsilon: 1e-10 };
        let name = run(k, &[lr_mom.of(1)], &[w.of(len), ms.of(len), mom.of(len)]);
        let (mut ww, mut wms, mut wmom) = (w0.clone(), s2.clone(), s1.clone());
        optim::apply_rmsprop(&mut ww, &mut wms, &mut wmom, gsrc, 0.05, 0.9, 0.5, 1e-10);
        r.f32(name, tag("rmsprop: w"), &g.down(&w, len), &ww, None);
        r.f32(name, tag("rmsprop: ms"), &g.down(&ms, len), &wms, None);
        r.f32(name, tag("rmsprop: mom"), &g.down(&mom, len), &wmom, None);

        let (w, acc) = (g.up(&w0), g.up(&s2));
        let name = run(Kernel::ApplyAdagrad {}, &[lr_mom.of(1)], &[w.of(len), acc.of(len)]);
        let (mut ww, mut wa) = (w0.clone(), s2.clone());
        optim::apply_adagrad(&mut ww, &mut wa, gsrc, 0.05);
        r.f32(name, tag("adagrad: w"), &g.down(&w, len), &ww, None);
        r.f32(name, tag("adagrad: accum"), &g.down(&acc, len), &wa, None);
    }

    // MultiApply: three variables of uneven lengths in one launch, each as its single update.
    let lens = [1usize, 4097, 300];
    let gs: Vec<Vec<f32>> = lens.iter().map(|&l| rng.vec(l, -1.0, 1.0)).collect();
    let ws: Vec<Vec<f32>> = lens.iter().map(|&l| rng.vec(l, -1.0, 1.0)).collect();
    let s1s: Vec<Vec<f32>> = lens.iter().map(|&l| rng.vec(l, -0.1, 0.1)).collect();
    let s2s: Vec<Vec<f32>> = lens.iter().map(|&l| rng.vec(l, 0.0, 0.01)).collect();
    let up_all = |v: &[Vec<f32>]| v.iter().map(|x| g.up(x)).collect::<Vec<_>>();
    let dg = up_all(&gs);
    for opt in ["gradient_descent", "momentum", "adam", "rmsprop", "adagrad"] {
        let (dw, d1, d2) = (up_all(&ws), up_all(&s1s), up_all(&s2s));
        // Each member's variable, then its slots (momentum's accum from
        // s1s; Adam's m, v from s1s, s2s; RMSProp's ms from the
        // non-negative s2s, mom from s1s; Adagrad's accum from s2s).
        let (apply, slots, rest): (Kernel, Vec<&[Dev<f32>]>, Vec<Operand>) = match opt {
            "gradient_descent" => (Kernel::ApplyGradientDescent {}, vec![], vec![lr_sgd.of(1)]),
            "momentum" => (Kernel::ApplyMomentum { momentum: 0.9, nesterov: true }, vec![&d1[..]], vec![lr_mom.of(1)]),
            "rmsprop" => (
                Kernel::ApplyRmsProp { decay: 0.9, momentum: 0.5, epsilon: 1e-10 },
                vec![&d2[..], &d1[..]],
                vec![lr_mom.of(1)],
            ),
            "adagrad" => (Kernel::ApplyAdagrad {}, vec![&d2[..]], vec![lr_mom.of(1)]),
            _ => (
                Kernel::ApplyAdam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 },
                vec![&d1[..], &d2[..]],
                vec![dstep.of(1), lr_adam.of(1)],
            ),
        };
        let mut ins: Vec<(u64, usize)> = dg.iter().zip(lens).map(|(d, l)| d.of(l)).collect();
        ins.extend(rest);
        let mut outs = Vec::new();
        for (t, &l) in lens.iter().enumerate() {
            outs.push(dw[t].of(l));
            outs.extend(slots.iter().map(|s| s[t].of(l)));
        }
        g.run(&Kernel::MultiApply { apply: Box::new(apply), count: 3 }, &ins, &outs, None);
        for (t, &l) in lens.iter().enumerate() {
            let (mut ww, mut w1, mut w2) = (ws[t].clone(), s1s[t].clone(), s2s[t].clone());
            match opt {
                "gradient_descent" => optim::apply_gradient_descent(&mut ww, &gs[t], 0.1),
                "momentum" => optim::apply_momentum(&mut ww, &mut w1, &gs[t], 0.05, 0.9, true),
                "rmsprop" => optim::apply_rmsprop(&mut ww, &mut w2, &mut w1, &gs[t], 0.05, 0.9, 0.5, 1e-10),
                "adagrad" => optim::apply_adagrad(&mut ww, &mut w2, &gs[t], 0.05),
                _ => optim::apply_adam(&mut ww, &mut w1, &mut w2, &gs[t], 0.001, 0.9, 0.999, 1e-8, step as u64 + 1),
            }
            r.f32("multi_apply", format!("{opt}, member {t} ({l}): w"), &g.down(&dw[t], l), &ww, None);
            if !matches!(opt, "gradient_descent" | "adagrad") {
                r.f32("multi_apply", format!("{opt}, member {t}: slot 1"), &g.down(&d1[t], l), &w1, None);
            }
            if matches!(opt, "adam" | "rmsprop" | "adagrad") {
                r.f32("multi_apply", format!("{opt}, member {t}: slot 2"), &g.down(&d2[t], l), &w2, None);
            }
        }
    }

    // IncrementStep, wrapping.
    for s in [0i32, 41, i32::MAX] {
        let d = g.up(&[s]);
        g.run(&Kernel::IncrementStep, &[], &[d.of(1)], None);
        r.i32("increment_step", format!("{s}"), &g.down(&d, 1), &[s.wrapping_add(1)]);
    }
}
