//! `--plot FILE.svg`: the loss curve (left axis) and, where known, the
//! training accuracy of the logged steps and the test accuracy (right axis,
//! 0 to 1) of a run as an SVG chart drawn with
//! `plotters`' SVG backend, for users without TensorBoard.
//!
//! Only SVG is written: plotters' bitmap backend needs a font rasterizer and
//! system fonts (heavy features); an SVG's text is drawn by the viewer. A
//! loss curve longer than [`MAX_POINTS`] is thinned to every k-th step (the
//! last step kept) so that a long run still gives a small file.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use thiserror::Error;

use crate::watch::History;

/// Most points drawn per curve.
pub const MAX_POINTS: usize = 2000;

/// Why a plot could not be written.
#[derive(Debug, Error)]
pub enum PlotError {
    #[error("--plot {path}: only .svg files are written (got {ext:?}); use e.g. --plot loss.svg")]
    Format { path: PathBuf, ext: String },
    #[error("--plot {path}: nothing to plot (the run recorded no loss)")]
    Empty { path: PathBuf },
    #[error("--plot {path}: {detail}")]
    Draw { path: PathBuf, detail: String },
}

/// Draws `h` into the SVG file `path`.
pub fn plot_svg(path: &Path, h: &History) -> Result<(), PlotError> {
    let ext = path.extension().map(|e| e.to_string_lossy().to_lowercase()).unwrap_or_default();
    if ext != "svg" {
        return Err(PlotError::Format { path: path.to_path_buf(), ext });
    }
    if h.loss.is_empty() {
        return Err(PlotError::Empty { path: path.to_path_buf() });
    }
    let mut svg = String::new();
    draw(&mut svg, h).map_err(|e| PlotError::Draw { path: path.to_path_buf(), detail: e.to_string() })?;
    // Written atomically: a full disk or a crash never leaves a torn file,
    // and a good file is replaced only by a whole one.
    crate::outputs::write_atomic(path, svg.as_bytes())
        .map_err(|e| PlotError::Draw { path: path.to_path_buf(), detail: e.to_string() })
}

/// Every k-th point (and the last), at most about [`MAX_POINTS`].
fn thin(points: &[(usize, f32)]) -> Vec<(f64, f64)> {
    let k = points.len().div_ceil(MAX_POINTS).max(1);
    let mut v: Vec<(f64, f64)> = points.iter().step_by(k).map(|&(s, l)| (s as f64, f64::from(l))).collect();
    if let Some(&(s, l)) = points.last() {
        if v.last().map(|p| p.0) != Some(s as f64) {
            v.push((s as f64, f64::from(l)));
        }
    }
    v
}

fn draw<'a>(svg: &'a mut String, h: &History) -> Result<(), Box<dyn std::error::Error + 'a>> {
    let loss = thin(&h.loss);
    let last_step = h.loss.iter().map(|p| p.0).chain(h.test_accuracy.iter().map(|p| p.0)).max().unwrap_or(1);
    let x_max = (last_step.max(1)) as f64;
    let finite = loss.iter().map(|p| p.1).filter(|l| l.is_finite());
    let y_max = finite.fold(0.0f64, f64::max).max(1e-3) * 1.05;

    let root = SVGBackend::with_string(svg, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("towers train", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .right_y_label_area_size(52)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?
        .set_secondary_coord(0f64..x_max, 0f64..1f64);
    chart.configure_mesh().x_desc("step").y_desc("loss").draw()?;
    chart.configure_secondary_axes().y_desc("accuracy").draw()?;
    chart
        .draw_series(LineSeries::new(loss.into_iter().filter(|p| p.1.is_finite()), &BLUE))?
        .label("loss")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    if !h.train_accuracy.is_empty() {
        let green = RGBColor(0, 128, 0);
        chart
            .draw_secondary_series(LineSeries::new(thin(&h.train_accuracy), &green))?
            .label("train accuracy")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], green));
    }
    if !h.test_accuracy.is_empty() {
        let acc: Vec<(f64, f64)> = h.test_accuracy.iter().map(|&(s, a)| (s as f64, a)).collect();
        chart
            .draw_secondary_series(LineSeries::new(acc.clone(), &RED))?
            .label("test accuracy")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart.draw_secondary_series(acc.into_iter().map(|p| Circle::new(p, 3, RED.filled())))?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_loss_and_accuracy_series() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("curves.svg");
        let h = History {
            loss: (1..=50).map(|s| (s, 2.0 / s as f32)).collect(),
            test_accuracy: vec![(25, 0.8), (50, 0.9)],
            learning_rate: vec![],
            train_accuracy: (5..=50).step_by(5).map(|s| (s, 0.5 + s as f32 / 120.0)).collect(),
        };
        plot_svg(&path, &h).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("read");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{}", &svg[..80.min(svg.len())]);
        let texts: Vec<&str> =
            svg.split("<text").skip(1).filter_map(|t| t.split('>').nth(1)).map(|t| t.trim()).collect();
        let texts: Vec<&str> = texts.iter().map(|t| t.trim_end_matches("</text").trim()).collect();
        for series in ["loss", "test accuracy", "train accuracy"] {
            assert!(texts.contains(&series), "the legend names {series}: {texts:?}");
        }
        // Each series is a polyline in its colour, plus its legend mark: loss
        // in blue with 50 points, accuracy in red with 2.
        let lines: Vec<&str> = svg.lines().filter(|l| l.starts_with("<polyline")).collect();
        let blue: Vec<&&str> = lines.iter().filter(|l| l.contains("stroke=\"#0000FF\"")).collect();
        let red: Vec<&&str> = lines.iter().filter(|l| l.contains("stroke=\"#FF0000\"")).collect();
        assert_eq!((blue.len(), red.len()), (2, 2));
        let points = |l: &str| {
            l.split("points=\"").nth(1).map_or(0, |p| p.split('"').next().unwrap_or("").split_whitespace().count())
        };
        assert_eq!(blue.iter().map(|l| points(l)).max(), Some(50));
        assert_eq!(red.iter().map(|l| points(l)).max(), Some(2));
        let green: Vec<&&str> = lines.iter().filter(|l| l.contains("stroke=\"#008000\"")).collect();
        assert_eq!(green.iter().map(|l| points(l)).max(), Some(10), "train accuracy: one point per logged step");
    }

    #[test]
    fn rejects_other_formats_and_empty_runs() {
        let h = History { loss: vec![(1, 1.0)], ..History::default() };
        let e = plot_svg(Path::new("x.png"), &h).expect_err("png");
        assert!(e.to_string().contains("--plot") && e.to_string().contains(".svg"), "{e}");
        let e = plot_svg(Path::new("x.svg"), &History::default()).expect_err("empty");
        assert!(matches!(e, PlotError::Empty { .. }));
    }

    #[test]
    fn thins_long_curves_keeping_the_last_step() {
        let pts: Vec<(usize, f32)> = (1..=10_001).map(|s| (s, 1.0)).collect();
        let v = thin(&pts);
        assert!(v.len() <= MAX_POINTS + 1, "{}", v.len());
        assert_eq!(v.last().map(|p| p.0), Some(10_001.0));
    }
}
