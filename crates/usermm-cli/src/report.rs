//! Results: rows of samples, their summaries, goals, and the three outputs
//! (the stdout tables, `report.md`, `results.json`).
//!
//! A [`Row`] is one (system, variant, metric) with one sample per run; its
//! value is the median of the samples, shown with min and max. A [`Goal`] is
//! computed only from medians of rows of the same run of the same experiment.

use std::fmt::Write as _;

/// One measured quantity, one sample per run.
pub struct Row {
    pub system: String,
    pub variant: String,
    pub metric: String,
    pub unit: String,
    pub samples: Vec<f64>,
}

impl Row {
    pub fn median(&self) -> f64 {
        median(&self.samples)
    }
    pub fn min(&self) -> f64 {
        self.samples.iter().copied().fold(f64::INFINITY, f64::min)
    }
    pub fn max(&self) -> f64 {
        self.samples.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }
}

/// The median (mean of the two middle values for an even count); NaN for none.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if !n.is_multiple_of(2) {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The `q`-quantile (0..=1) of `sorted` by the nearest-rank method.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A goal check: `value` compared with a threshold (PASS/FAIL) and with the
/// goal proper (met or not).
pub struct Goal {
    pub what: String,
    /// How `value` was computed, e.g. "usermm/kernel".
    pub how: String,
    pub value: f64,
    pub unit: String,
    /// `true`: value must be at least the bounds; `false`: at most.
    pub at_least: bool,
    pub threshold: f64,
    pub goal: f64,
}

impl Goal {
    fn ok(&self, bound: f64) -> Option<bool> {
        if !self.value.is_finite() {
            return None;
        }
        Some(if self.at_least { self.value >= bound } else { self.value <= bound })
    }
    /// PASS or FAIL against the threshold; "not measured" when the value is
    /// not a number (a row it needs is missing, or a ratio of zeros).
    pub fn verdict(&self) -> &'static str {
        match self.ok(self.threshold) {
            Some(true) => "PASS",
            Some(false) => "FAIL",
            None => "not measured",
        }
    }
    pub fn goal_met(&self) -> &'static str {
        match self.ok(self.goal) {
            Some(true) => "yes",
            Some(false) => "no",
            None => "not measured",
        }
    }
    fn bound(&self, b: f64) -> String {
        format!("{} {}{}", if self.at_least { "≥" } else { "≤" }, fmt_num(b), self.unit)
    }
}

/// A summary table an experiment lays out itself (one line per row of its
/// own choosing), printed before the generic rows; it repeats numbers of
/// the rows, it adds none to `results.json`.
pub struct Table {
    pub title: String,
    pub head: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// One experiment's parameters, rows, goals, notes and plots.
pub struct Experiment {
    pub name: String,
    pub title: String,
    pub params: Vec<(String, String)>,
    pub rows: Vec<Row>,
    pub goals: Vec<Goal>,
    /// Free text for report.md (what each row means, caveats), one paragraph
    /// per entry.
    pub notes: Vec<String>,
    /// `(file name, svg text)`.
    pub plots: Vec<(String, String)>,
    /// Summary tables (see [`Table`]).
    pub tables: Vec<Table>,
    pub elapsed_s: f64,
}

impl Experiment {
    pub fn new(name: &str, title: &str, params: Vec<(String, String)>) -> Experiment {
        Experiment {
            name: name.into(),
            title: title.into(),
            params,
            rows: Vec::new(),
            goals: Vec::new(),
            notes: Vec::new(),
            plots: Vec::new(),
            tables: Vec::new(),
            elapsed_s: 0.0,
        }
    }

    /// Adds one sample to the row (system, variant, metric), creating it.
    pub fn add(&mut self, system: &str, variant: &str, metric: &str, unit: &str, v: f64) {
        if let Some(r) = self.rows.iter_mut().find(|r| r.system == system && r.variant == variant && r.metric == metric)
        {
            r.samples.push(v);
            return;
        }
        self.rows.push(Row {
            system: system.into(),
            variant: variant.into(),
            metric: metric.into(),
            unit: unit.into(),
            samples: vec![v],
        });
    }

    pub fn row(&self, system: &str, variant: &str, metric: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.system == system && r.variant == variant && r.metric == metric)
    }

    /// The median of a row, NaN if the row does not exist.
    pub fn med(&self, system: &str, variant: &str, metric: &str) -> f64 {
        self.row(system, variant, metric).map_or(f64::NAN, Row::median)
    }

    /// Adds a goal on `usermm/kernel` of the medians of one variant and metric.
    pub fn ratio_goal(&mut self, what: &str, variant: &str, metric: &str, at_least: bool, threshold: f64, goal: f64) {
        self.ratio_goal_vs("kernel", what, variant, metric, at_least, threshold, goal);
    }

    /// Adds a goal on `usermm/base` of the medians of one variant and metric
    /// (not measured when either row is missing).
    #[allow(clippy::too_many_arguments)]
    pub fn ratio_goal_vs(
        &mut self,
        base: &str,
        what: &str,
        variant: &str,
        metric: &str,
        at_least: bool,
        threshold: f64,
        goal: f64,
    ) {
        let v = self.med("usermm", variant, metric) / self.med(base, variant, metric);
        self.goals.push(Goal {
            what: what.into(),
            how: format!("usermm/{base}, {variant} {metric}"),
            value: v,
            unit: "×".into(),
            at_least,
            threshold,
            goal,
        });
    }
}

/// Formats a number for people: about four significant digits.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e5 || (a - a.round()).abs() < 1e-9 && a >= 1.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        trim(format!("{v:.1}"))
    } else if a >= 1.0 {
        trim(format!("{v:.3}"))
    } else {
        trim(format!("{v:.4}"))
    }
}

/// Drops trailing zeros after a decimal point ("0.8000" → "0.8").
fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A parameter value as JSON: a number when it parses as one, else a string.
fn json_param(v: &str) -> serde_json::Value {
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() && !v.starts_with('+') => json_num(x),
        _ => v.into(),
    }
}

/// A number as JSON: integral values as integers, non-finite ones as null.
fn json_num(v: f64) -> serde_json::Value {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 2f64.powi(53) {
        serde_json::Value::from(v as i64)
    } else {
        serde_json::Value::from(v) // null unless finite
    }
}

/// `results.json`: `{"experiments":[{"name", "params", "rows":[…]}]}`.
pub fn to_json(exps: &[Experiment]) -> String {
    use serde_json::{json, Map, Value};
    let exps: Vec<Value> = exps
        .iter()
        .map(|e| {
            let params: Map<String, Value> = e.params.iter().map(|(k, v)| (k.clone(), json_param(v))).collect();
            let rows: Vec<Value> = e
                .rows
                .iter()
                .map(|r| {
                    json!({
                        "system": r.system,
                        "variant": r.variant,
                        "metric": r.metric,
                        "value": json_num(r.median()),
                        "unit": r.unit,
                        "runs": r.samples.len(),
                        "min": json_num(r.min()),
                        "max": json_num(r.max()),
                    })
                })
                .collect();
            json!({ "name": e.name, "params": params, "rows": rows })
        })
        .collect();
    let mut o = serde_json::to_string_pretty(&json!({ "experiments": exps })).expect("a Value always serializes");
    o.push('\n');
    o
}

/// Lays out rows of cells as aligned text columns.
fn text_table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i] - c.chars().count();
            s.push_str(c);
            s.push_str(&" ".repeat(pad + 2));
        }
        s.trim_end().to_string() + "\n"
    };
    let mut o = line(head.iter().map(|s| s.to_string()).collect());
    o += &line(w.iter().map(|&n| "-".repeat(n)).collect());
    for r in rows {
        o += &line(r.clone());
    }
    o
}

fn md_table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut o = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
    for r in rows {
        let _ = writeln!(o, "| {} |", r.join(" | "));
    }
    o
}

fn row_cells(r: &Row) -> Vec<String> {
    vec![
        r.system.clone(),
        r.variant.clone(),
        r.metric.clone(),
        fmt_num(r.median()),
        format!("[{}..{}]", fmt_num(r.min()), fmt_num(r.max())),
        r.unit.clone(),
        r.samples.len().to_string(),
    ]
}

const ROW_HEAD: [&str; 7] = ["system", "variant", "metric", "median", "[min..max]", "unit", "runs"];
const GOAL_HEAD: [&str; 6] = ["goal", "measured as", "value", "threshold", "verdict", "goal (met?)"];

fn goal_cells(g: &Goal) -> Vec<String> {
    vec![
        g.what.clone(),
        g.how.clone(),
        format!("{}{}", fmt_num(g.value), g.unit),
        g.bound(g.threshold),
        g.verdict().into(),
        format!("{} ({})", g.bound(g.goal), g.goal_met()),
    ]
}

/// The rows and goals of one experiment, as aligned text for stdout.
pub fn text(e: &Experiment) -> String {
    let rows: Vec<Vec<String>> = e.rows.iter().map(row_cells).collect();
    let mut o = format!("\n== {} — {} ({:.1} s)\n", e.name, e.title, e.elapsed_s);
    for t in &e.tables {
        let head: Vec<&str> = t.head.iter().map(String::as_str).collect();
        o += &format!("{}\n", t.title);
        o += &text_table(&head, &t.rows);
        o += "\n";
    }
    o += &text_table(&ROW_HEAD, &rows);
    if !e.goals.is_empty() {
        o += "\n";
        o += &text_table(&GOAL_HEAD, &e.goals.iter().map(goal_cells).collect::<Vec<_>>());
    }
    o
}

/// All goals of all experiments, as aligned text for stdout.
pub fn goals_text(exps: &[Experiment]) -> String {
    let rows: Vec<Vec<String>> = exps
        .iter()
        .flat_map(|e| {
            e.goals.iter().map(move |g| {
                let mut c = goal_cells(g);
                c.insert(0, e.name.clone());
                c
            })
        })
        .collect();
    let mut head = vec!["experiment"];
    head.extend(GOAL_HEAD);
    text_table(&head, &rows)
}

/// `report.md`.
pub fn markdown(exps: &[Experiment], header: &[(String, String)], mode: &str) -> String {
    let mut o = String::from("# usermm report\n\n");
    let _ =
        writeln!(o, "Mode: {mode}. Every row is the median of its runs, with [min..max] and the number of runs; the");
    o += "systems of a row alternate run by run. Ratios use medians of rows of this run only.\n\n## Machine and space\n\n";
    o += &md_table(&["item", "value"], &header.iter().map(|(k, v)| vec![k.clone(), v.clone()]).collect::<Vec<_>>());
    o += "\n## Goals\n\n";
    let rows: Vec<Vec<String>> = exps
        .iter()
        .flat_map(|e| {
            e.goals.iter().map(move |g| {
                let mut c = goal_cells(g);
                c.insert(0, e.name.clone());
                c
            })
        })
        .collect();
    let mut head = vec!["experiment"];
    head.extend(GOAL_HEAD);
    o += &md_table(&head, &rows);
    o += "\nPASS/FAIL is against the threshold; the last column is the goal proper.\n";
    for e in exps {
        let _ = write!(o, "\n## `{}` — {}\n\nTook {:.1} s.\n\n### Parameters\n\n", e.name, e.title, e.elapsed_s);
        o += &md_table(
            &["parameter", "value"],
            &e.params.iter().map(|(k, v)| vec![format!("`{k}`"), v.clone()]).collect::<Vec<_>>(),
        );
        for t in &e.tables {
            let head: Vec<&str> = t.head.iter().map(String::as_str).collect();
            let _ = write!(o, "\n### {}\n\n", t.title);
            o += &md_table(&head, &t.rows);
        }
        o += "\n### Results\n\n";
        o += &md_table(&ROW_HEAD, &e.rows.iter().map(row_cells).collect::<Vec<_>>());
        if !e.goals.is_empty() {
            o += "\n### Goals\n\n";
            o += &md_table(&GOAL_HEAD, &e.goals.iter().map(goal_cells).collect::<Vec<_>>());
        }
        if !e.notes.is_empty() {
            o += "\n### Notes\n\n";
            for n in &e.notes {
                let _ = writeln!(o, "{n}\n");
            }
        }
        for (file, _) in &e.plots {
            let _ = writeln!(o, "\n![{file}]({file})");
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `results.json` keeps its documented shape: numbers stay numbers
    /// (integral ones without a fraction), a parameter that is not a number
    /// is a string, a value that is not finite is `null`, and text with
    /// quotes and control characters survives the round trip.
    #[test]
    fn json_has_the_documented_shape() {
        let mut e = Experiment::new(
            "x\"y",
            "t",
            vec![("runs".into(), "3".into()), ("dir".into(), "/tmp/a\nb".into()), ("plus".into(), "+1".into())],
        );
        e.add("usermm", "v", "throughput", "pages/s", 2.0);
        e.add("usermm", "v", "throughput", "pages/s", 0.5);
        e.add("usermm", "v", "throughput", "pages/s", 4.0);
        e.add("kernel", "v", "ratio", "×", f64::NAN);
        let text = to_json(&[e]);
        assert!(text.contains("\"runs\": 3,") && text.contains("\"value\": 2,"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("parses");
        let e = &v["experiments"][0];
        assert_eq!(e["name"], "x\"y");
        assert_eq!(e["params"]["runs"], 3);
        assert_eq!(e["params"]["dir"], "/tmp/a\nb");
        assert_eq!(e["params"]["plus"], "+1");
        let r = &e["rows"][0];
        assert_eq!((r["value"].as_f64(), r["min"].as_f64(), r["max"].as_f64()), (Some(2.0), Some(0.5), Some(4.0)));
        assert_eq!(r["runs"], 3);
        assert!(e["rows"][1]["value"].is_null(), "{text}");
    }
}
