//! Hand-written SVG line plots (no plotting dependency): a few series of
//! `(x, y)` points, linear or log10 axes, a legend.
//!
//! Kept after comparing it with plotters 0.3.7 (SVG backend, `LineSeries`,
//! log x axis, ~20 lines) on the `fault` experiment's latency CDF, both
//! rendered with `rsvg-convert` and looked at side by side: plotters' plot
//! took a fifth of the lines but looked worse with its defaults — the x axis
//! began at the smallest sample with no decade label below 10 ("10.0",
//! "100.0"), the legend sat over the data, a dense minor grid and a yellow
//! series were hard to read — and fixing each costs configuration, plus
//! three crates to build. This file's 213 lines give decade ticks from 1,
//! the legend beside the plot, and the axis marked "(log)".

use std::fmt::Write as _;

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

pub struct Plot<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub log_x: bool,
    pub log_y: bool,
    /// Draw markers at each point (for a few points) instead of a bare line.
    pub markers: bool,
}

const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const W: f64 = 720.0;
const H: f64 = 440.0;
const L: f64 = 80.0;
const R: f64 = 200.0;
const T: f64 = 40.0;
const B: f64 = 60.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn tick_label(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(0.01..1e6).contains(&a) {
        format!("{v:.0e}")
    } else if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Ticks for an axis over `[lo, hi]` (already in log10 when `log`).
fn ticks(lo: f64, hi: f64, log: bool) -> Vec<(f64, String)> {
    if log {
        let (a, b) = (lo.floor() as i32, hi.ceil() as i32);
        (a..=b).map(|e| (e as f64, tick_label(10f64.powi(e)))).collect()
    } else {
        let span = (hi - lo).max(1e-12);
        let raw = span / 5.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(mag * 10.0);
        let mut v = (lo / step).ceil() * step;
        let mut out = Vec::new();
        while v <= hi + step * 1e-9 {
            out.push((v, tick_label(v)));
            v += step;
        }
        out
    }
}

/// The plot area's width and height in pixels.
const PW: f64 = W - L - R;
const PH: f64 = H - T - B;

/// The data bounds of the plot area (on the axes' scales: log10 on a log
/// axis).
struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    /// The bounds of `all` (already on the axes' scales): whole decades on a
    /// log axis, from 0 on a linear y axis, never empty.
    fn of(p: &Plot, all: &[(f64, f64)]) -> Frame {
        let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
        for &(x, y) in all {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if all.is_empty() {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if !p.log_y && y0 > 0.0 {
            y0 = 0.0;
        }
        if p.log_x {
            (x0, x1) = (x0.floor(), x1.ceil());
        }
        if p.log_y {
            (y0, y1) = (y0.floor(), y1.ceil());
        }
        if x1 - x0 < 1e-12 {
            x1 = x0 + 1.0;
        }
        if y1 - y0 < 1e-12 {
            y1 = y0 + 1.0;
        }
        Frame { x0, x1, y0, y1 }
    }
    fn sx(&self, x: f64) -> f64 {
        L + (x - self.x0) / (self.x1 - self.x0) * PW
    }
    fn sy(&self, y: f64) -> f64 {
        T + PH - (y - self.y0) / (self.y1 - self.y0) * PH
    }
}

/// Renders the plot; points with a non-positive coordinate on a log axis
/// are left out.
pub fn render(p: &Plot, series: &[Series]) -> String {
    let tx = |x: f64| if p.log_x { x.log10() } else { x };
    let ty = |y: f64| if p.log_y { y.log10() } else { y };
    let keep = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && (!p.log_x || x > 0.0) && (!p.log_y || y > 0.0);
    let pts: Vec<Vec<(f64, f64)>> =
        series.iter().map(|s| s.points.iter().filter(|q| keep(q)).map(|&(x, y)| (tx(x), ty(y))).collect()).collect();
    let all: Vec<(f64, f64)> = pts.iter().flatten().copied().collect();
    let f = Frame::of(p, &all);
    let mut o = String::new();
    let _ = writeln!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(o, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    axes(&mut o, p, &f);
    lines(&mut o, p, &f, series, &pts);
    o.push_str("</svg>\n");
    o
}

/// The title, the grid with its tick labels, the frame and the axis labels.
fn axes(o: &mut String, p: &Plot, f: &Frame) {
    let _ = writeln!(
        o,
        "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>",
        L + PW / 2.0,
        esc(p.title)
    );
    for (v, label) in ticks(f.x0, f.x1, p.log_x) {
        let x = f.sx(v);
        let _ = writeln!(o, "<line x1=\"{x:.1}\" y1=\"{T}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#ddd\"/>", T + PH);
        let _ = writeln!(o, "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>", T + PH + 16.0, esc(&label));
    }
    for (v, label) in ticks(f.y0, f.y1, p.log_y) {
        let y = f.sy(v);
        let _ = writeln!(o, "<line x1=\"{L}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>", L + PW);
        let _ = writeln!(o, "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>", L - 6.0, y + 4.0, esc(&label));
    }
    let _ = writeln!(o, "<rect x=\"{L}\" y=\"{T}\" width=\"{PW}\" height=\"{PH}\" fill=\"none\" stroke=\"black\"/>");
    let _ = writeln!(
        o,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}{}</text>",
        L + PW / 2.0,
        H - 18.0,
        esc(p.x_label),
        if p.log_x { " (log)" } else { "" }
    );
    let _ = writeln!(
        o,
        "<text x=\"18\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {})\">{}{}</text>",
        T + PH / 2.0,
        T + PH / 2.0,
        esc(p.y_label),
        if p.log_y { " (log)" } else { "" }
    );
}

/// Every series' polyline (and markers), and its legend entry.
fn lines(o: &mut String, p: &Plot, f: &Frame, series: &[Series], pts: &[Vec<(f64, f64)>]) {
    for (i, (s, pts)) in series.iter().zip(pts).enumerate() {
        let c = COLORS[i % COLORS.len()];
        if !pts.is_empty() {
            let path: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", f.sx(x), f.sy(y))).collect();
            let _ = writeln!(
                o,
                "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"1.8\" points=\"{}\"/>",
                path.join(" ")
            );
            if p.markers {
                for &(x, y) in pts {
                    let _ = writeln!(o, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{c}\"/>", f.sx(x), f.sy(y));
                }
            }
        }
        let ly = T + 10.0 + i as f64 * 20.0;
        let lx = L + PW + 12.0;
        let _ = writeln!(
            o,
            "<line x1=\"{lx}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"3\"/>",
            lx + 20.0
        );
        let _ = writeln!(o, "<text x=\"{}\" y=\"{}\">{}</text>", lx + 26.0, ly + 4.0, esc(&s.name));
    }
}

/// The empirical CDF of `sorted` as at most `max_points` points.
pub fn cdf(sorted: &[f64], max_points: usize) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 {
        return Vec::new();
    }
    let step = (n / max_points.max(1)).max(1);
    let mut v: Vec<(f64, f64)> = (0..n).step_by(step).map(|i| (sorted[i], (i + 1) as f64 / n as f64)).collect();
    v.push((sorted[n - 1], 1.0));
    v
}
