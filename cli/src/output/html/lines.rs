//! The three kinds of chart the report draws, each from plain numbers: lines
//! over an x axis (linear or log; optional shaded x spans and out-of-memory
//! crosses), a histogram, and a node × node heat map. The report-specific
//! code (plots.rs, telemetry.rs) only picks the numbers and the words.

use std::collections::BTreeSet;
use std::ops::Range;

use anyhow::Result;
use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::chart::{self, Key, Plot, Swatch, ALERT, SHADE};

/// One line (or row of dots) of a chart.
pub struct Series {
    pub label: String,
    pub colour: RGBColor,
    pub points: Vec<(f64, f64)>,
    /// Dots on the points (few points read better with them).
    pub dots: bool,
    /// A line through the points (off for a scatter).
    pub line: bool,
}

impl Series {
    pub fn line(label: impl Into<String>, colour: RGBColor, points: Vec<(f64, f64)>) -> Self {
        let dots = points.len() <= 40;
        Series {
            label: label.into(),
            colour,
            points,
            dots,
            line: true,
        }
    }

    pub fn dots(label: impl Into<String>, colour: RGBColor, points: Vec<(f64, f64)>) -> Self {
        Series {
            label: label.into(),
            colour,
            points,
            dots: true,
            line: false,
        }
    }
}

/// A line chart: the words around it and the data in it.
pub struct Lines {
    pub id: String,
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub series: Vec<Series>,
    pub x_log: bool,
    /// The x axis' labels (sizes as `1 MiB`, say); None: plain numbers.
    pub x_fmt: Option<fn(f64) -> String>,
    /// The top of the y axis when the data should not set it (100 %).
    pub y_min_top: f64,
    /// The x axis' ends when the data should not set them (linear axes only).
    pub x_range: Option<(f64, f64)>,
    /// Shaded x spans behind the lines (throttle periods).
    pub bands: Vec<(f64, f64)>,
    /// Out-of-memory trials: a vermillion cross each.
    pub crosses: Vec<(f64, f64)>,
    pub height: u32,
    pub legend_extra: Vec<Key>,
    pub note: String,
}

impl Lines {
    pub fn new(id: &str, title: impl Into<String>, x_desc: &str, y_desc: &str) -> Self {
        Lines {
            id: id.to_string(),
            title: title.into(),
            x_desc: x_desc.to_string(),
            y_desc: y_desc.to_string(),
            series: Vec::new(),
            x_log: false,
            x_fmt: None,
            y_min_top: 0.0,
            x_range: None,
            bands: Vec::new(),
            crosses: Vec::new(),
            height: 380,
            legend_extra: Vec::new(),
            note: String::new(),
        }
    }

    /// The y axis' top: above every point and cross, at least `y_min_top`.
    pub fn y_top(&self) -> f64 {
        let ys = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1));
        chart::upto(ys.chain(self.crosses.iter().map(|p| p.1))).max(self.y_min_top)
    }

    pub fn plot(self) -> Result<Plot> {
        let xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .chain(self.crosses.iter().map(|p| p.0))
            .chain(self.bands.iter().flat_map(|b| [b.0, b.1]))
            .filter(|x| x.is_finite() && (!self.x_log || *x > 0.0))
            .collect();
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut marks: BTreeSet<String> = self
            .series
            .iter()
            .filter(|s| !s.points.is_empty())
            .map(|s| chart::hex(s.colour))
            .collect();
        if !self.crosses.is_empty() {
            marks.insert(chart::hex(ALERT));
        }
        let y = 0.0..self.y_top();
        let svg = if self.x_log {
            let (lo, hi) = if hi > lo {
                (lo, hi)
            } else {
                (lo / 2.0, hi * 2.0)
            };
            let (lo, hi) = if lo > 0.0 { (lo, hi) } else { (1.0, 2.0) };
            chart::render(self.height, &marks, |root| {
                // Sizes and batches double: powers of two make the ticks.
                draw_lines(root, &self, (lo..hi).log_scale().base(2.0), y)
            })?
        } else {
            // Times and ranks start at 0; the axis does too.
            let (lo, hi) = self.x_range.unwrap_or_else(|| chart::span(lo.min(0.0), hi));
            chart::render(self.height, &marks, |root| {
                draw_lines(root, &self, lo..hi, y)
            })?
        };
        let mut legend: Vec<Key> = self
            .series
            .iter()
            .map(|s| {
                let swatch = if s.line { Swatch::Line } else { Swatch::Dot };
                Key::new(s.label.clone(), s.colour, swatch)
            })
            .collect();
        if !self.crosses.is_empty() {
            legend.push(Key::new("out of memory", ALERT, Swatch::Cross));
        }
        legend.extend(self.legend_extra);
        Ok(Plot {
            id: self.id,
            title: self.title,
            svg,
            legend,
            note: self.note,
        })
    }
}

fn draw_lines<X>(
    root: &DrawingArea<SVGBackend, Shift>,
    l: &Lines,
    x: X,
    y: Range<f64>,
) -> chart::Drawn
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let top = y.end;
    let mut c = ChartBuilder::on(root)
        .margin(12)
        .margin_right(24)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)?;
    let fmt = |v: &f64| match l.x_fmt {
        Some(f) => f(*v),
        None => trim_number(*v),
    };
    c.configure_mesh()
        .x_desc(l.x_desc.as_str())
        .y_desc(l.y_desc.as_str())
        .axis_desc_style(chart::font(19))
        .label_style(chart::font(16))
        .x_label_formatter(&fmt)
        .y_label_formatter(&|v| trim_number(*v))
        .bold_line_style(chart::grid())
        .light_line_style(TRANSPARENT)
        .draw()?;
    c.draw_series(
        l.bands
            .iter()
            .map(|(a, b)| Rectangle::new([(*a, 0.0), (*b, top)], SHADE.mix(0.3).filled())),
    )?;
    for s in &l.series {
        if s.line && s.points.len() > 1 {
            c.draw_series(LineSeries::new(
                s.points.iter().copied(),
                s.colour.stroke_width(2),
            ))?;
        }
        if s.dots || s.points.len() == 1 {
            c.draw_series(
                s.points
                    .iter()
                    .map(|p| Circle::new(*p, 4, s.colour.filled())),
            )?;
        }
    }
    c.draw_series(
        l.crosses
            .iter()
            .map(|p| Cross::new(*p, 7, ALERT.stroke_width(3))),
    )?;
    Ok(())
}

/// Axis numbers without trailing zeros: `0.5`, `12`, `1500`.
pub fn trim_number(v: f64) -> String {
    // No `-0` at the origin.
    let v = if v.abs() < 1e-12 { 0.0 } else { v };
    let s = if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Whole numbers only (ranks): the ticks between them stay unlabelled.
pub fn whole_number(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        trim_number(v.round())
    } else {
        String::new()
    }
}

/// A histogram of `values` in `bins` equal bins.
pub struct Histogram {
    pub id: String,
    pub title: String,
    pub x_desc: String,
    pub label: String,
    pub colour: RGBColor,
    pub values: Vec<f64>,
    pub bins: usize,
    pub note: String,
}

impl Histogram {
    /// (bin start, bin end, count) for every bin.
    pub fn counts(&self) -> Vec<(f64, f64, usize)> {
        let lo = self.values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = self
            .values
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = chart::span(lo, hi);
        let n = self.bins.max(1);
        let w = (hi - lo) / n as f64;
        let mut counts = vec![0usize; n];
        for v in &self.values {
            let i = (((v - lo) / w) as usize).min(n - 1);
            counts[i] += 1;
        }
        (0..n)
            .map(|i| (lo + w * i as f64, lo + w * (i + 1) as f64, counts[i]))
            .collect()
    }

    pub fn plot(self) -> Result<Plot> {
        let bins = self.counts();
        let top = chart::upto(bins.iter().map(|b| b.2 as f64));
        let (lo, hi) = (bins[0].0, bins[bins.len() - 1].1);
        let marks: BTreeSet<String> = [chart::hex(self.colour)].into();
        let svg = chart::render(360, &marks, |root| {
            let mut c = ChartBuilder::on(root)
                .margin(12)
                .margin_right(24)
                .x_label_area_size(48)
                .y_label_area_size(72)
                .build_cartesian_2d(lo..hi, 0.0..top)?;
            c.configure_mesh()
                .x_desc(self.x_desc.as_str())
                .y_desc("steps")
                .axis_desc_style(chart::font(19))
                .label_style(chart::font(16))
                .x_label_formatter(&|v| trim_number(*v))
                .y_label_formatter(&|v| trim_number(*v))
                .bold_line_style(chart::grid())
                .light_line_style(TRANSPARENT)
                .disable_x_mesh()
                .draw()?;
            c.draw_series(bins.iter().filter(|b| b.2 > 0).map(|(a, b, n)| {
                Rectangle::new([(*a, 0.0), (*b, *n as f64)], self.colour.filled())
            }))?;
            Ok(())
        })?;
        Ok(Plot {
            id: self.id,
            title: self.title,
            svg,
            legend: vec![Key::new(self.label, self.colour, Swatch::Area)],
            note: self.note,
        })
    }
}

/// A node × node matrix of one figure; `slow` cells are outlined.
pub struct Heatmap {
    pub id: String,
    pub title: String,
    pub names: Vec<String>,
    /// (row, column) → (value, slow); symmetric pairs appear twice.
    pub cells: Vec<(usize, usize, f64, bool)>,
    pub unit: String,
    pub note: String,
}

/// Light to dark blue as a value goes from 0 to the largest: one hue, so it
/// reads the same to every colour vision.
fn ramp(t: f64) -> RGBColor {
    let t = t.clamp(0.0, 1.0);
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * t).round() as u8;
    RGBColor(mix(0xDE, 0x08), mix(0xEB, 0x45), mix(0xF7, 0x94))
}

impl Heatmap {
    pub fn plot(self) -> Result<Plot> {
        let n = self.names.len() as i32;
        let max = chart::upto(self.cells.iter().map(|c| c.2)) / 1.1;
        let fill = |v: f64| ramp(v / max);
        let mut marks: BTreeSet<String> =
            self.cells.iter().map(|c| chart::hex(fill(c.2))).collect();
        if self.cells.iter().any(|c| c.3) {
            marks.insert(chart::hex(ALERT));
        }
        let height = (140 + 56 * n as u32).clamp(260, 900);
        let names = &self.names;
        let svg = chart::render(height, &marks, |root| {
            let mut c = ChartBuilder::on(root)
                .margin(12)
                .margin_right(24)
                .x_label_area_size(48)
                .y_label_area_size(140)
                // An i32 range's ends are both in it: 0..n-1 is n cells.
                .build_cartesian_2d((0..n - 1).into_segmented(), (0..n - 1).into_segmented())?;
            let label = |v: &SegmentValue<i32>| match v {
                SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
                _ => String::new(),
            };
            // Row 0 at the top, as in the table report's matrix.
            let row_label = |v: &SegmentValue<i32>| match v {
                SegmentValue::CenterOf(i) => names
                    .get((n - 1 - *i) as usize)
                    .cloned()
                    .unwrap_or_default(),
                _ => String::new(),
            };
            c.configure_mesh()
                .disable_mesh()
                .x_labels(n as usize)
                .y_labels(n as usize)
                .x_desc("node")
                .y_desc("node")
                .axis_desc_style(chart::font(19))
                .label_style(chart::font(16))
                .x_label_formatter(&label)
                .y_label_formatter(&row_label)
                .draw()?;
            let at = |r: usize, col: usize, dr: i32, dc: i32| {
                (
                    SegmentValue::Exact(col as i32 + dc),
                    SegmentValue::Exact(n - 1 - r as i32 + dr),
                )
            };
            c.draw_series(self.cells.iter().map(|(r, col, v, _)| {
                Rectangle::new([at(*r, *col, 0, 0), at(*r, *col, 1, 1)], fill(*v).filled())
            }))?;
            // A path, not a rectangle: plotters' SVG rectangles drop the stroke width.
            c.draw_series(self.cells.iter().filter(|x| x.3).map(|(r, col, _, _)| {
                let corners = [(0, 0), (0, 1), (1, 1), (1, 0), (0, 0)];
                let path: Vec<_> = corners
                    .iter()
                    .map(|(dr, dc)| at(*r, *col, *dr, *dc))
                    .collect();
                PathElement::new(path, ALERT.stroke_width(4))
            }))?;
            let text = chart::font(17).pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Center,
                plotters::style::text_anchor::VPos::Center,
            ));
            c.draw_series(self.cells.iter().map(|(r, col, v, _)| {
                let style = if *v / max > 0.55 {
                    text.clone().color(&WHITE)
                } else {
                    text.clone()
                };
                Text::new(
                    format!("{v:.2}"),
                    (
                        SegmentValue::CenterOf(*col as i32),
                        SegmentValue::CenterOf(n - 1 - *r as i32),
                    ),
                    style,
                )
            }))?;
            Ok(())
        })?;
        let mut legend = vec![
            Key::new(format!("slower ({})", self.unit), ramp(0.15), Swatch::Area),
            Key::new(format!("faster ({})", self.unit), ramp(1.0), Swatch::Area),
        ];
        if self.cells.iter().any(|c| c.3) {
            legend.push(Key::new("slow link (fail)", ALERT, Swatch::Outline));
        }
        Ok(Plot {
            id: self.id,
            title: self.title,
            svg,
            legend,
            note: self.note,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_numbers_read_plainly() {
        assert_eq!(trim_number(-0.0), "0");
        assert_eq!(trim_number(0.25), "0.25");
        assert_eq!(trim_number(12.0), "12");
        assert_eq!(trim_number(1500.4), "1500");
        assert_eq!(whole_number(2.0), "2");
        assert_eq!(whole_number(0.4), "");
    }
}
