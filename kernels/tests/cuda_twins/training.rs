//! Dropout (Philox masks), batch norm, and the variable updates: moving
//! averages, optimizers, the fused tower reduction, the step counter.

use towers_kernels::cuda::{grid_rows, BLOCK};

use crate::cpu;
use crate::harness::{n, Dev, Gpu, Report, Rng, A};

pub(crate) fn dropout(g: &Gpu, r: &mut Report, rng: &mut Rng) {
    // Philox known answers (kernels/src/random.rs).
    let (c, k, o) = (g.up(&[0u32; 4]), g.up(&[0u32; 2]), g.up(&[0u32; 4]));
    g.launch("dropout", "towers_philox4x32_10", 1, 32, &[c.a(), k.a(), o.a()]);
    let got: Vec<i32> = g.down(&o, 4).iter().map(|v| *v as i32).collect();
    let want: Vec<i32> = cpu::random::philox4x32_10([0; 4], [0; 2]).iter().map(|v| *v as i32).collect();
    r.i32("dropout", "philox4x32_10 known answer", &got, &want);
    let ctr = [0x243f6a88u32, 0x85a308d3, 0x13198a2e, 0x03707344];
    let key = [0xa4093822u32, 0x299f31d0];
    let (c, k) = (g.up(&ctr), g.up(&key));
    g.launch("dropout", "towers_philox4x32_10", 1, 32, &[c.a(), k.a(), o.a()]);
    let got: Vec<i32> = g.down(&o, 4).iter().map(|v| *v as i32).collect();
    let want: Vec<i32> = cpu::random::philox4x32_10(ctr, key).iter().map(|v| *v as i32).collect();
    r.i32("dropout", "philox4x32_10 pi digits", &got, &want);
    // Masks and outputs, from element 0 (the kernels' dropout) and at an offset (a tower's rows).
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
        let st = g.up(&[step as u32, (step >> 32) as u32]);
        g.ew(
            "dropout",
            "towers_dropout_f32",
            len,
            &[n(len), A::F32(keep), A::U64(seed), st.a(), A::U64(offset as u64), dx.a(), y.a(), m.a()],
        );
        let (mut wy, mut wm) = (vec![0f32; len], vec![0f32; len]);
        if offset == 0 {
            cpu::dropout::dropout(&x, keep, seed, step, 0, &mut wy, &mut wm);
        } else {
            cpu::dropout_at(&x, keep, seed, step, offset, &mut wy, &mut wm);
        }
        let case = format!("n {len} keep {keep} offset {offset}");
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
        g.launch(
            "batchnorm",
            "towers_batch_norm_stats_f32",
            grid_rows(c),
            BLOCK,
            &[n(rows), n(c), A::F32(eps), dx.a(), mean.a(), inv_std.a(), var.a()],
        );
        g.ew(
            "batchnorm",
            "towers_batch_norm_apply_f32",
            len,
            &[n(len), n(c), dx.a(), dg.a(), db.a(), mean.a(), inv_std.a(), y.a()],
        );
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
        g.ew(
            "batchnorm",
            "towers_batch_norm_infer_f32",
            len,
            &[n(len), n(c), A::F32(eps), dx.a(), dg.a(), db.a(), dmm.a(), dmv.a(), y.a(), om.a(), oi.a(), ov.a()],
        );
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
        g.launch(
            "batchnorm",
            "towers_batch_norm_grad_reduce_f32",
            grid_rows(c),
            BLOCK,
            &[n(rows), n(c), dgy.a(), dx.a(), dm.a(), dis.a(), dgam.a(), dbet.a()],
        );
        g.ew(
            "batchnorm",
            "towers_batch_norm_grad_dx_f32",
            len,
            &[n(len), n(c), dgy.a(), dx.a(), dg.a(), dm.a(), dis.a(), dgam.a(), dbet.a(), dxo.a()],
        );
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
    let o = A::F32;

    // AssignMovingAverage
    let v = g.up(&w0);
    g.ew("optim", "towers_assign_moving_average_f32", len, &[n(len), o(0.99), dgr.a(), v.a()]);
    let want: Vec<f32> = w0.iter().zip(&grad).map(|(v, x)| *v * 0.99 + *x * (1.0 - 0.99)).collect();
    r.f32("assign_moving_average", "decay 0.99", &g.down(&v, len), &want, None);

    // The optimizers, plain and fused with the tower reduction (3 towers).
    let towers: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(len, -1.0, 1.0)).collect();
    let weights = [0.375f32, 0.375, 0.25];
    let tdev: Vec<Dev<f32>> = towers.iter().map(|t| g.up(t)).collect();
    let tp = g.ptrs(&tdev.iter().collect::<Vec<_>>());
    let dwt = g.up(&weights);
    let mut mean_g = vec![0f32; len];
    misc::weighted_sum(&towers.iter().map(|t| t.as_slice()).collect::<Vec<_>>(), &weights, &mut mean_g);
    let step = 4i32; // global_step: the update uses t = 5
    let dstep = g.up(&[step]);
    // The learning rate is a device scalar the update reads each step.
    let (lr_sgd, lr_mom, lr_adam) = (g.up(&[0.1f32]), g.up(&[0.05f32]), g.up(&[0.001f32]));

    for fused in [false, true] {
        let gsrc: &[f32] = if fused { &mean_g } else { &grad };
        let kernel = |k: &'static str| if fused { "mean_apply" } else { k };
        let tag = |s: &str| if fused { format!("{s}, 3 towers fused") } else { s.to_string() };
        let head = |nn: usize| if fused { vec![n(nn), A::I32(3), tp.a(), dwt.a()] } else { vec![n(nn)] };

        let w = g.up(&w0);
        let mut a = head(len);
        a.push(lr_sgd.a());
        if !fused {
            a.push(dgr.a());
        }
        a.push(w.a());
        g.ew(
            "optim",
            if fused { "towers_mean_apply_gradient_descent_f32" } else { "towers_apply_gradient_descent_f32" },
            len,
            &a,
        );
        let mut want = w0.clone();
        optim::apply_gradient_descent(&mut want, gsrc, 0.1);
        r.f32(kernel("apply_gradient_descent"), tag("gradient descent"), &g.down(&w, len), &want, None);

        for nesterov in [0, 1] {
            let (w, acc) = (g.up(&w0), g.up(&s1));
            let mut a = head(len);
            a.extend([lr_mom.a(), o(0.9), A::I32(nesterov)]);
            if !fused {
                a.push(dgr.a());
            }
            a.extend([w.a(), acc.a()]);
            g.ew("optim", if fused { "towers_mean_apply_momentum_f32" } else { "towers_apply_momentum_f32" }, len, &a);
            let (mut ww, mut wa) = (w0.clone(), s1.clone());
            optim::apply_momentum(&mut ww, &mut wa, gsrc, 0.05, 0.9, nesterov == 1);
            let case = tag(if nesterov == 1 { "momentum, nesterov" } else { "momentum" });
            r.f32(kernel("apply_momentum"), format!("{case}: w"), &g.down(&w, len), &ww, None);
            r.f32(kernel("apply_momentum"), format!("{case}: accum"), &g.down(&acc, len), &wa, None);
        }

        let (w, m, vv) = (g.up(&w0), g.up(&s1), g.up(&s2));
        let mut a = head(len);
        a.extend([lr_adam.a(), o(0.9), o(0.999), o(1e-8)]);
        if !fused {
            a.push(dgr.a());
        }
        a.extend([dstep.a(), w.a(), m.a(), vv.a()]);
        g.ew("optim", if fused { "towers_mean_apply_adam_f32" } else { "towers_apply_adam_f32" }, len, &a);
        let (mut ww, mut wm, mut wv) = (w0.clone(), s1.clone(), s2.clone());
        optim::apply_adam(&mut ww, &mut wm, &mut wv, gsrc, 0.001, 0.9, 0.999, 1e-8, step as u64 + 1);
        r.f32(kernel("apply_adam"), tag("adam step 5: w"), &g.down(&w, len), &ww, None);
        r.f32(kernel("apply_adam"), tag("adam step 5: m"), &g.down(&m, len), &wm, None);
        r.f32(kernel("apply_adam"), tag("adam step 5: v"), &g.down(&vv, len), &wv, None);

        // RMSProp (ms from s2 >= 0, mom from s1) and Adagrad (accum from s2), issue 22.
        let (w, ms, mom) = (g.up(&w0), g.up(&s2), g.up(&s1));
        let mut a = head(len);
        a.extend([lr_mom.a(), o(0.9), o(0.5), o(1e-10)]);
        if !fused {
            a.push(dgr.a());
        }
        a.extend([w.a(), ms.a(), mom.a()]);
        g.ew("optim", if fused { "towers_mean_apply_rmsprop_f32" } else { "towers_apply_rmsprop_f32" }, len, &a);
        let (mut ww, mut wms, mut wmom) = (w0.clone(), s2.clone(), s1.clone());
        optim::apply_rmsprop(&mut ww, &mut wms, &mut wmom, gsrc, 0.05, 0.9, 0.5, 1e-10);
        r.f32(kernel("apply_rmsprop"), tag("rmsprop: w"), &g.down(&w, len), &ww, None);
        r.f32(kernel("apply_rmsprop"), tag("rmsprop: ms"), &g.down(&ms, len), &wms, None);
        r.f32(kernel("apply_rmsprop"), tag("rmsprop: mom"), &g.down(&mom, len), &wmom, None);

        let (w, acc) = (g.up(&w0), g.up(&s2));
        let mut a = head(len);
        a.push(lr_mom.a());
        if !fused {
            a.push(dgr.a());
        }
        a.extend([w.a(), acc.a()]);
        g.ew("optim", if fused { "towers_mean_apply_adagrad_f32" } else { "towers_apply_adagrad_f32" }, len, &a);
        let (mut ww, mut wa) = (w0.clone(), s2.clone());
        optim::apply_adagrad(&mut ww, &mut wa, gsrc, 0.05);
        r.f32(kernel("apply_adagrad"), tag("adagrad: w"), &g.down(&w, len), &ww, None);
        r.f32(kernel("apply_adagrad"), tag("adagrad: accum"), &g.down(&acc, len), &wa, None);
    }

    // MultiApply: three variables of uneven lengths in one launch, each as its single update.
    let lens = [1usize, 4097, 300];
    let offsets: Vec<i64> = std::iter::once(0)
        .chain(lens.iter().scan(0i64, |s, l| {
            *s += *l as i64;
            Some(*s)
        }))
        .collect();
    let total = offsets[3] as usize;
    let doff = g.up(&offsets);
    let gs: Vec<Vec<f32>> = lens.iter().map(|&l| rng.vec(l, -1.0, 1.0)).collect();
    let ws: Vec<Vec<f32>> = lens.iter().map(|&l| rng.vec(l, -1.0, 1.0)).collect();
    let s1s: Vec<Vec<f32>> = lens.iter().map(|&l| rng.vec(l, -0.1, 0.1)).collect();
    let s2s: Vec<Vec<f32>> = lens.iter().map(|&l| rng.vec(l, 0.0, 0.01)).collect();
    let up_all = |v: &[Vec<f32>]| v.iter().map(|x| g.up(x)).collect::<Vec<_>>();
    let dg = up_all(&gs);
    let dgp = g.ptrs(&dg.iter().collect::<Vec<_>>());
    for opt in ["gradient_descent", "momentum", "adam", "rmsprop", "adagrad"] {
        let (dw, d1, d2) = (up_all(&ws), up_all(&s1s), up_all(&s2s));
        let (pw, p1, p2) = (
            g.ptrs(&dw.iter().collect::<Vec<_>>()),
            g.ptrs(&d1.iter().collect::<Vec<_>>()),
            g.ptrs(&d2.iter().collect::<Vec<_>>()),
        );
        let mut a = vec![n(total), A::I32(3), doff.a(), dgp.a(), pw.a()];
        match opt {
            "gradient_descent" => a.push(lr_sgd.a()),
            "momentum" => a.extend([p1.a(), lr_mom.a(), o(0.9), A::I32(1)]),
            // ms from the non-negative s2s, mom from s1s.
            "rmsprop" => a.extend([p2.a(), p1.a(), lr_mom.a(), o(0.9), o(0.5), o(1e-10)]),
            "adagrad" => a.extend([p2.a(), lr_mom.a()]),
            _ => a.extend([p1.a(), p2.a(), lr_adam.a(), o(0.9), o(0.999), o(1e-8), dstep.a()]),
        }
        g.ew("optim", &format!("towers_multi_apply_{opt}_f32"), total, &a);
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
        g.launch("optim", "towers_increment_step_i32", 1, 1, &[d.a()]);
        r.i32("increment_step", format!("{s}"), &g.down(&d, 1), &[s.wrapping_add(1)]);
    }
}
