//! The plumbing under every plot of the HTML report: the colour-blind-safe
//! palette, a plotters SVG canvas rendered into a String, and the tagging of
//! the data marks (every shape drawn in one of the plot's data colours gets a
//! `data-mark` attribute) that the page's self-check counts, so an empty plot
//! is told apart from one with axes only.

use std::collections::BTreeSet;
use std::error::Error;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

/// Okabe–Ito's colours (no black, no vermillion: black is the axes' colour,
/// vermillion means out of memory or slow) followed by Paul Tol's muted ones.
pub const SERIES: [RGBColor; 9] = [
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0x88, 0x22, 0x55),
    RGBColor(0x44, 0xAA, 0x99),
    RGBColor(0x99, 0x99, 0x33),
    RGBColor(0x33, 0x22, 0x88),
];

/// Out-of-memory trials and slow links: Okabe–Ito's vermillion.
pub const ALERT: RGBColor = RGBColor(0xD5, 0x5E, 0x00);

/// Throttle periods: a grey band behind the lines.
pub const SHADE: RGBColor = RGBColor(0x99, 0x99, 0x99);

/// Series `i`'s colour; the palette repeats past its end.
pub fn colour(i: usize) -> RGBColor {
    SERIES[i % SERIES.len()]
}

/// `#RRGGBB`, the way plotters' SVG backend writes colours.
pub fn hex(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// How a legend entry's swatch looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swatch {
    Line,
    Dot,
    Cross,
    Area,
    Outline,
}

/// One legend entry: the legend is HTML under the plot, so long node names
/// wrap instead of being cut by plotters' guess of text widths.
#[derive(Debug, Clone)]
pub struct Key {
    pub label: String,
    pub colour: String,
    pub swatch: Swatch,
}

impl Key {
    pub fn new(label: impl Into<String>, c: RGBColor, swatch: Swatch) -> Self {
        Key {
            label: label.into(),
            colour: hex(c),
            swatch,
        }
    }
}

/// A finished plot: its SVG with the data marks tagged, and what the page
/// shows around it.
#[derive(Debug, Clone)]
pub struct Plot {
    /// The figure's HTML id (`plot-busbw`), also what the self-check names.
    pub id: String,
    pub title: String,
    pub svg: String,
    pub legend: Vec<Key>,
    /// A sentence under the plot (why maxbatch stopped, what is shaded).
    pub note: String,
}

pub type Drawn = std::result::Result<(), Box<dyn Error>>;

pub const WIDTH: u32 = 960;

/// Draws on a white `WIDTH`×`height` SVG canvas and returns the SVG with
/// every shape in one of `marks` tagged as a data mark.
pub fn render<F>(height: u32, marks: &BTreeSet<String>, draw: F) -> Result<String>
where
    F: FnOnce(&DrawingArea<SVGBackend, Shift>) -> Drawn,
{
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
        draw(&root).map_err(|e| anyhow!("plot: {e}"))?;
        root.present().map_err(|e| anyhow!("plot: {e}"))?;
    }
    Ok(tag_marks(&svg, marks, WIDTH, height))
}

/// The text style of titles, axis descriptions and labels.
pub fn font(size: u32) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&BLACK)
}

/// Light grid lines, so the data stands out.
pub fn grid() -> ShapeStyle {
    RGBColor(0xDD, 0xDD, 0xDD).stroke_width(1)
}

const SHAPES: [&str; 5] = ["<polyline ", "<circle ", "<rect ", "<polygon ", "<line "];

/// plotters writes one element a line. A shape is a data mark when its fill or
/// stroke is one of `marks` (a polyline needs points too); the `<svg>` line
/// becomes a scalable one without the namespace URL (inline SVG needs none,
/// and the page then has no URL at all).
fn tag_marks(svg: &str, marks: &BTreeSet<String>, width: u32, height: u32) -> String {
    let mut out = String::with_capacity(svg.len() + 64);
    for line in svg.lines() {
        if line.starts_with("<svg ") {
            out.push_str(&format!(
                "<svg class=\"chart\" viewBox=\"0 0 {width} {height}\" role=\"img\">\n"
            ));
            continue;
        }
        let shape = SHAPES.iter().find(|s| line.starts_with(*s));
        let coloured = marks.iter().any(|m| {
            line.contains(&format!("fill=\"{m}\"")) || line.contains(&format!("stroke=\"{m}\""))
        });
        match shape {
            Some(s) if coloured && !line.contains("points=\"\"") => {
                let tag = s.trim_end();
                out.push_str(tag);
                out.push_str(" data-mark=\"\"");
                out.push_str(&line[tag.len()..]);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// A padded range that is never empty: plotters needs lo < hi.
pub fn span(lo: f64, hi: f64) -> (f64, f64) {
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if hi > lo {
        (lo, hi)
    } else if hi == 0.0 {
        (0.0, 1.0)
    } else {
        (lo - hi.abs() * 0.1, hi + hi.abs() * 0.1)
    }
}

/// 0 up to a bit above the largest value, for figures that start at zero.
pub fn upto(values: impl Iterator<Item = f64>) -> f64 {
    let max = values.filter(|v| v.is_finite()).fold(0.0, f64::max);
    if max > 0.0 {
        max * 1.1
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_in_a_data_colour_are_tagged_and_the_rest_are_not() {
        let marks: BTreeSet<String> = [hex(colour(0))].into();
        let svg = render(200, &marks, |root| {
            let mut chart = ChartBuilder::on(root)
                .x_label_area_size(30)
                .y_label_area_size(30)
                .build_cartesian_2d(0.0..10.0, 0.0..10.0)?;
            chart.configure_mesh().draw()?;
            chart.draw_series(LineSeries::new([(1.0, 1.0), (5.0, 5.0)], colour(0)))?;
            chart.draw_series([Circle::new((2.0, 2.0), 3, colour(1).filled())])?;
            Ok(())
        })
        .unwrap();
        assert_eq!(svg.matches("data-mark").count(), 1, "{svg}");
        assert!(svg.starts_with("<svg class=\"chart\" viewBox=\"0 0 960 200\""));
        assert!(!svg.contains("http"), "{svg}");
        assert!(
            svg.contains("<polyline data-mark=\"\" fill=\"none\""),
            "{svg}"
        );
    }

    #[test]
    fn ranges_are_never_empty() {
        assert_eq!(span(3.0, 3.0), (2.7, 3.3));
        assert_eq!(span(0.0, 0.0), (0.0, 1.0));
        assert_eq!(upto([0.0, 2.0].into_iter()), 2.2);
        assert_eq!(upto(std::iter::empty()), 1.0);
    }
}
