//! The demo's HTML report: one self-contained file (inline CSS and SVG) with a timeline
//! row per lease (singletons first, then shards) whose bars show which node held it when,
//! one colour per node, the injected faults as labelled lines and bands, under it a strip of
//! the load's throughput, unanswered requests and p99 latency per second on the same time
//! axis, the summary table and the checker's verdict.

use std::fmt::Write;

use crate::availability::{self, Request};

use super::summary::Summary;
use super::timeline::Timeline;

/// Node colours, in order of first appearance (cycled beyond eight nodes).
pub const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// What the report shows besides the timeline.
#[derive(Debug, Clone)]
pub struct ReportInput<'a> {
    /// `(setting, value)` rows describing the run (seed, nodes, ttl, store, history …).
    pub run: Vec<(String, String)>,
    /// The holds and faults to draw.
    pub timeline: &'a Timeline,
    /// The run's counts.
    pub summary: &'a Summary,
    /// The checker's violations, explained; empty when the history is safe.
    pub violations: &'a [String],
    /// Lease name prefix left out of row labels (`<system>-`).
    pub system: &'a str,
    /// Faults from here on are the final shutdown: drawn as one line.
    pub scenario_end_ns: u64,
    /// The load's requests (acknowledged or not), for the throughput and latency strip.
    pub requests: &'a [Request],
}

const LABEL_W: f64 = 230.0;
const RIGHT_W: f64 = 40.0;
const CHART_W: f64 = 1000.0;
const ROW_H: f64 = 12.0;
const ROW_GAP: f64 = 2.0;
const HEAD_H: f64 = 64.0;
const AXIS_H: f64 = 22.0;

/// The colour of `node` in `timeline`.
pub fn colour(timeline: &Timeline, node: &str) -> &'static str {
    let i = timeline.nodes.iter().position(|n| n == node).unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

/// The colour of a pause's (yellow) or a cut's (blue) band.
fn band_colour(kind: &str) -> &'static str {
    if kind == "paused" {
        "#e0b000"
    } else {
        "#3b8eea"
    }
}

/// Escapes text for HTML and SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Rows: singletons first, then shards by type and numeric id.
fn row_order(timeline: &Timeline) -> Vec<&String> {
    let mut leases: Vec<&String> = timeline.holds.keys().collect();
    leases.sort_by_key(|name| {
        let shard = name.contains("-shard-");
        let (head, id) = name.rsplit_once('-').unwrap_or((name.as_str(), ""));
        (
            shard,
            head.to_string(),
            id.parse::<u64>().unwrap_or(u64::MAX),
            id.to_string(),
        )
    });
    leases
}

/// The whole report.
pub fn render(input: &ReportInput<'_>) -> String {
    let tl = input.timeline;
    let safe = input.violations.is_empty();
    let mut html = String::new();
    let _ = write!(
        html,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Tenure demo report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; }}
h1 {{ font-size: 22px; }} h2 {{ font-size: 17px; margin-top: 28px; }}
table {{ border-collapse: collapse; font-size: 14px; }}
td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: left; }}
.verdict {{ padding: 10px 16px; font-size: 18px; font-weight: bold; display: inline-block; border-radius: 4px; }}
.safe {{ background: #dff5e1; color: #1b5e20; }} .unsafe {{ background: #fde0e0; color: #b71c1c; }}
.legend span {{ display: inline-block; margin-right: 18px; font-size: 14px; }}
.legend i {{ display: inline-block; width: 14px; height: 14px; margin-right: 6px; vertical-align: -2px; }}
svg text {{ font-size: 10px; font-family: monospace; }}
.note {{ color: #555; font-size: 13px; max-width: 1100px; }}
</style></head><body>
<h1>Tenure demo: who held which lease when</h1>
<div class="verdict {cls}">{verdict}</div>
"#,
        cls = if safe { "safe" } else { "unsafe" },
        verdict = if safe {
            "SAFE: no lease was held by two nodes at once, tokens always increased".to_string()
        } else {
            format!("UNSAFE: {} violation(s)", input.violations.len())
        },
    );
    if !safe {
        html.push_str("<ul>");
        for v in input.violations {
            let _ = write!(html, "<li><pre>{}</pre></li>", esc(v));
        }
        html.push_str("</ul>");
    }
    html.push_str("<h2>Summary</h2><table>");
    let s = input.summary;
    for (k, v) in [
        ("operations acknowledged", s.acks.to_string()),
        ("fenced writes accepted", s.writes_accepted.to_string()),
        (
            "fenced writes refused (stale token)",
            s.writes_refused.to_string(),
        ),
        ("singleton ticks written", s.ticks.to_string()),
        ("lease grants (shards and singletons)", s.grants.to_string()),
        ("leases lost by their holder", s.losses.to_string()),
        ("history span", format!("{:.1} s", s.span_ns as f64 / 1e9)),
    ] {
        let _ = write!(html, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(&v));
    }
    html.push_str("</table>");
    if !s.failovers.is_empty() {
        html.push_str(
            "<h2>Fail-over and service per fault</h2><table><tr><th>at</th><th>fault</th><th>fail-over</th><th>service during the fault</th></tr>",
        );
        for f in &s.failovers {
            let _ = write!(
                html,
                "<tr><td>{:.1} s</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                f.fault.t_ns.saturating_sub(tl.start_ns) as f64 / 1e9,
                esc(&f.fault.label()),
                esc(&f.describe()),
                esc(&f.service.describe())
            );
        }
        html.push_str("</table>");
    }
    html.push_str("<h2>Run</h2><table>");
    for (k, v) in &input.run {
        let _ = write!(html, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
    }
    html.push_str("</table>");
    html.push_str("<h2>Timeline</h2><div class=\"legend\">");
    for node in &tl.nodes {
        let _ = write!(
            html,
            "<span><i style=\"background:{}\"></i>{}</span>",
            colour(tl, node),
            esc(node)
        );
    }
    html.push_str(
        "</div><p class=\"note\">One row per lease; a bar is one node's hold, from grant to \
         stop (hover for node, token and times). A paler tail is a node frozen (SIGSTOP) past \
         the ttl: its lease lapsed while it could do nothing, and it noticed on resume. Red lines mark \
         SIGKILL, grey lines a graceful leave, a restart or the final shutdown; bands a \
         SIGSTOP (yellow) or a cut link (blue).</p>",
    );
    html.push_str(&svg(input));
    html.push_str(
        "<h2>Load</h2><p class=\"note\">Per second of the run, on the timeline's axis: \
         acknowledged requests (grey bars) and, stacked on them, requests that got no answer (red, by when they \
         gave up), and the p99 latency of the acknowledged ones (black line). Faults are \
         marked as above.</p>",
    );
    html.push_str(&strip(input));
    html.push_str("</body></html>\n");
    html
}

/// A fault to draw: start, end (bands), label, kind.
type Mark<'a> = (u64, Option<u64>, String, &'a str);

/// The faults of the scenario, then the final shutdown as one mark.
fn marks<'a>(input: &'a ReportInput<'_>) -> Vec<Mark<'a>> {
    let tl = input.timeline;
    let mut marks: Vec<Mark<'a>> = Vec::new();
    for f in tl.faults.iter().filter(|f| f.t_ns < input.scenario_end_ns) {
        marks.push((f.t_ns, f.until_ns, f.label(), f.kind.as_str()));
    }
    if let Some(first) = tl.faults.iter().find(|f| f.t_ns >= input.scenario_end_ns) {
        marks.push((first.t_ns, None, "shutdown".into(), "leaving"));
    }
    marks
}

/// The x of instant `t` (ns) on the timeline's axis.
fn x_of(tl: &Timeline, t: u64) -> f64 {
    let span = tl.end_ns.saturating_sub(tl.start_ns).max(1) as f64;
    LABEL_W + t.saturating_sub(tl.start_ns) as f64 / span * CHART_W
}

/// The time axis under a chart whose bottom is at `bottom`: a tick every 5 s (every 10 s
/// beyond two minutes).
fn axis(out: &mut String, tl: &Timeline, bottom: f64) {
    let span = tl.end_ns.saturating_sub(tl.start_ns).max(1) as f64;
    let step = if span > 120e9 { 10 } else { 5 };
    let mut sec = 0u64;
    while (sec as f64) * 1e9 <= span {
        let xt = LABEL_W + sec as f64 * 1e9 / span * CHART_W;
        let _ = write!(
            out,
            r##"<line x1="{xt:.1}" x2="{xt:.1}" y1="{bottom:.1}" y2="{:.1}" stroke="#444"/><text x="{:.1}" y="{:.1}">{sec}s</text>"##,
            bottom + 4.0,
            xt - 6.0,
            bottom + 16.0
        );
        sec += step;
    }
}

const STRIP_H: f64 = 70.0;
const STRIP_GAP: f64 = 14.0;

/// The load strip: per second, acknowledgements and unanswered requests as bars, and the
/// p99 latency of the acknowledged requests as a line, under the faults' bands and lines.
fn strip(input: &ReportInput<'_>) -> String {
    let tl = input.timeline;
    let seconds = (tl.end_ns.saturating_sub(tl.start_ns)).div_ceil(1_000_000_000) as usize;
    let (start, end) = (tl.start_ns as i64, tl.end_ns as i64);
    let acks = availability::acks_per_second(input.requests, start, end);
    let mut unanswered = vec![0usize; seconds];
    let mut ended: Vec<Vec<&Request>> = vec![Vec::new(); seconds];
    for r in input.requests {
        if r.ended < start || r.ended >= end {
            continue;
        }
        let i = ((r.ended - start) / 1_000_000_000) as usize;
        match r.acked() {
            true => ended[i].push(r),
            false => unanswered[i] += 1,
        }
    }
    let p99: Vec<Option<f64>> = ended
        .iter()
        .map(|reqs| availability::latency_quantile(reqs, 0.99))
        .collect();
    let top_rate = acks
        .iter()
        .zip(&unanswered)
        .map(|(a, u)| a + u)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let top_ms = p99.iter().flatten().copied().fold(1.0, f64::max);
    let rate_top = STRIP_GAP;
    let rate_bottom = rate_top + STRIP_H;
    let lat_top = rate_bottom + STRIP_GAP * 1.5;
    let lat_bottom = lat_top + STRIP_H;
    let height = lat_bottom + AXIS_H;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg class="load" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" viewBox="0 0 {w} {height}">"#,
        w = LABEL_W + CHART_W + RIGHT_W
    );
    let marks = marks(input);
    for (t_ns, until, label, kind) in &marks {
        let x0 = x_of(tl, *t_ns);
        match until {
            Some(until) => {
                let _ = write!(
                    out,
                    r#"<rect class="fault" x="{x0:.1}" y="{rate_top:.1}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="0.25"><title>{}</title></rect>"#,
                    (x_of(tl, *until) - x0).max(1.0),
                    lat_bottom - rate_top,
                    band_colour(kind),
                    esc(label)
                );
            }
            None => {
                let stroke = if *kind == "killed" { "#d00" } else { "#666" };
                let _ = write!(
                    out,
                    r#"<line class="fault" x1="{x0:.1}" x2="{x0:.1}" y1="{rate_top:.1}" y2="{lat_bottom:.1}" stroke="{stroke}" stroke-width="1.5" stroke-dasharray="4 2"><title>{}</title></line>"#,
                    esc(label)
                );
            }
        }
    }
    let _ = write!(
        out,
        r##"<text x="4" y="{:.1}">requests/s (max {})</text><text x="4" y="{:.1}" fill="#c62828">no answer/s</text><text x="4" y="{:.1}">p99 latency (max {top_ms:.0} ms)</text>"##,
        rate_top + 10.0,
        top_rate as usize,
        rate_top + 24.0,
        lat_top + 10.0,
    );
    let bar_w = CHART_W / seconds.max(1) as f64;
    for (i, (&ok, &lost)) in acks.iter().zip(&unanswered).enumerate() {
        let x0 = LABEL_W + i as f64 * bar_w;
        let h_ok = ok as f64 / top_rate * STRIP_H;
        let h_lost = lost as f64 / top_rate * STRIP_H;
        let _ = write!(
            out,
            r##"<rect class="acks" x="{x0:.1}" y="{:.1}" width="{:.1}" height="{h_ok:.1}" fill="#9e9e9e"><title>{i} s: {ok} acknowledged, {lost} unanswered</title></rect>"##,
            rate_bottom - h_ok,
            (bar_w - 0.5).max(0.5),
        );
        if lost > 0 {
            let _ = write!(
                out,
                r##"<rect class="unanswered" x="{x0:.1}" y="{:.1}" width="{:.1}" height="{h_lost:.1}" fill="#c62828" fill-opacity="0.8"/>"##,
                rate_bottom - h_ok - h_lost,
                (bar_w - 0.5).max(0.5),
            );
        }
    }
    let points: Vec<String> = p99
        .iter()
        .enumerate()
        .filter_map(|(i, ms)| {
            ms.map(|ms| {
                format!(
                    "{:.1},{:.1}",
                    LABEL_W + (i as f64 + 0.5) * bar_w,
                    lat_bottom - ms / top_ms * STRIP_H
                )
            })
        })
        .collect();
    if !points.is_empty() {
        let _ = write!(
            out,
            r##"<polyline class="p99" points="{}" fill="none" stroke="#222" stroke-width="1.2"/>"##,
            points.join(" ")
        );
    }
    for y in [rate_bottom, lat_bottom] {
        let _ = write!(
            out,
            r##"<line x1="{LABEL_W}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#bbb"/>"##,
            LABEL_W + CHART_W
        );
    }
    axis(&mut out, tl, lat_bottom);
    out.push_str("</svg>");
    out
}

fn svg(input: &ReportInput<'_>) -> String {
    let tl = input.timeline;
    let rows = row_order(tl);
    let x = |t: u64| x_of(tl, t);
    let height = HEAD_H + rows.len() as f64 * (ROW_H + ROW_GAP) + AXIS_H;
    let bottom = HEAD_H + rows.len() as f64 * (ROW_H + ROW_GAP);
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" viewBox="0 0 {w} {height}">"#,
        w = LABEL_W + CHART_W + RIGHT_W
    );
    let marks = marks(input);
    for (t_ns, until, _, kind) in &marks {
        if let Some(until) = until {
            let _ = write!(
                out,
                r#"<rect x="{:.1}" y="{HEAD_H}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="0.3"/>"#,
                x(*t_ns),
                (x(*until) - x(*t_ns)).max(1.0),
                bottom - HEAD_H,
                band_colour(kind)
            );
        }
    }
    for (r, lease) in rows.iter().enumerate() {
        let y = HEAD_H + r as f64 * (ROW_H + ROW_GAP);
        let short = lease
            .strip_prefix(&format!("{}-", input.system))
            .unwrap_or(lease);
        // The sharding coordinator is a singleton named sharding-<type>-coordinator.
        let label = match short
            .strip_prefix("singleton-sharding-")
            .and_then(|rest| rest.strip_suffix("-coordinator"))
        {
            Some(type_name) => format!("coordinator of {type_name}"),
            None => short.to_string(),
        };
        let _ = write!(
            out,
            r#"<text x="4" y="{:.1}">{}</text>"#,
            y + ROW_H - 2.0,
            esc(&label)
        );
        for h in &tl.holds[*lease] {
            let c = colour(tl, &h.node);
            let (x0, x1) = (x(h.from_ns), x(h.until_ns));
            let _ = write!(
                out,
                r#"<rect class="hold" data-node="{node}" x="{x0:.1}" y="{y:.1}" width="{w:.1}" height="{ROW_H}" fill="{c}"><title>{lease}: {node} token {token}, {from:.2} s to {until:.2} s</title></rect>"#,
                node = esc(&h.node),
                w = (x1 - x0).max(0.5),
                lease = esc(lease),
                token = h.token,
                from = h.from_ns.saturating_sub(tl.start_ns) as f64 / 1e9,
                until = h.until_ns.saturating_sub(tl.start_ns) as f64 / 1e9,
            );
            if let Some(noticed) = h.noticed_ns {
                let _ = write!(
                    out,
                    r#"<rect class="lapsed" x="{x1:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{c}" opacity="0.25"><title>{}: frozen, the lease lapsed; noticed the loss at {:.2} s</title></rect>"#,
                    y + 3.0,
                    (x(noticed) - x1).max(0.5),
                    ROW_H - 6.0,
                    esc(&h.node),
                    noticed.saturating_sub(tl.start_ns) as f64 / 1e9
                );
            }
        }
    }
    // Faults over the bars: a pause or a cut as a dashed frame (its fill is drawn under
    // the bars, so node colours stay true), the rest as dashed lines, the final shutdown as
    // one line; labels on top in four staggered lines so that close faults stay readable
    // (anchored at their end near the right edge).
    for (i, (t_ns, until, label, kind)) in marks.iter().enumerate() {
        let x0 = x(*t_ns);
        let label_y = 12.0 + (i % 4) as f64 * 12.0;
        if let Some(until) = until {
            let colour = band_colour(kind);
            let _ = write!(
                out,
                r#"<rect class="fault" x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="{colour}" stroke-width="1.5" stroke-dasharray="4 2"><title>{}</title></rect>"#,
                label_y + 2.0,
                (x(*until) - x0).max(1.0),
                bottom - label_y - 2.0,
                esc(label)
            );
        } else {
            let stroke = if *kind == "killed" { "#d00" } else { "#666" };
            let _ = write!(
                out,
                r#"<line class="fault" x1="{x0:.1}" x2="{x0:.1}" y1="{:.1}" y2="{bottom:.1}" stroke="{stroke}" stroke-width="1.5" stroke-dasharray="4 2"/>"#,
                label_y + 2.0
            );
        }
        let near_end = x0 > LABEL_W + CHART_W * 0.75;
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{label_y:.1}" text-anchor="{}">{}</text>"#,
            if near_end { x0 - 2.0 } else { x0 + 2.0 },
            if near_end { "end" } else { "start" },
            esc(label)
        );
    }
    axis(&mut out, tl, bottom);
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::timeline::{FaultMark, Hold};
    use super::*;

    fn hold(node: &str, token: u64, from: u64, until: u64) -> Hold {
        Hold {
            node: node.into(),
            inc: "1".into(),
            token,
            from_ns: from,
            until_ns: until,
            noticed_ns: None,
        }
    }

    fn timeline() -> Timeline {
        let s = 1_000_000_000;
        let mut holds = BTreeMap::new();
        holds.insert(
            "tenure-shard-counter-1".to_string(),
            vec![hold("a:1", 1, 0, 4 * s), hold("b:2", 2, 6 * s, 10 * s)],
        );
        holds.insert(
            "tenure-singleton-demo".to_string(),
            vec![hold("b:2", 1, s, 10 * s)],
        );
        Timeline {
            start_ns: 0,
            end_ns: 10 * s,
            holds,
            faults: vec![FaultMark {
                kind: "killed".into(),
                node: "a:1".into(),
                peer: None,
                t_ns: 4 * s,
                until_ns: None,
            }],
            nodes: vec!["a:1".into(), "b:2".into()],
        }
    }

    /// Each hold's bar as (node, colour), in document order.
    fn bars(html: &str) -> Vec<(String, String)> {
        html.split("<rect class=\"hold\"")
            .skip(1)
            .map(|rest| {
                let attr = |name: &str| {
                    let start = rest.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
                    rest[start..][..rest[start..].find('"').unwrap()].to_string()
                };
                (attr("data-node"), attr("fill"))
            })
            .collect()
    }

    #[test]
    fn the_report_has_one_bar_per_hold_in_its_node_colour() {
        let tl = timeline();
        let summary = Summary::default();
        let html = render(&ReportInput {
            run: vec![("seed".into(), "7".into())],
            timeline: &tl,
            summary: &summary,
            violations: &[],
            system: "tenure",
            scenario_end_ns: u64::MAX,
            requests: &[],
        });
        // Singleton row first, then the shard's two holds.
        assert_eq!(
            bars(&html),
            vec![
                ("b:2".to_string(), PALETTE[1].to_string()),
                ("a:1".to_string(), PALETTE[0].to_string()),
                ("b:2".to_string(), PALETTE[1].to_string()),
            ]
        );
        assert!(html.contains("SAFE"));
        assert!(html.contains("SIGKILL a:1"));
        assert!(html.contains(">singleton-demo<") && html.contains(">shard-counter-1<"));
        // Self-contained: nothing is loaded from elsewhere.
        assert!(!html.contains("src=") && !html.contains("href="));
    }

    #[test]
    fn an_unsafe_verdict_lists_the_violations_escaped() {
        let tl = timeline();
        let summary = Summary::default();
        let violations = vec!["lease <x> held twice".to_string()];
        let html = render(&ReportInput {
            run: Vec::new(),
            timeline: &tl,
            summary: &summary,
            violations: &violations,
            system: "tenure",
            scenario_end_ns: u64::MAX,
            requests: &[],
        });
        assert!(html.contains("UNSAFE: 1 violation(s)"));
        assert!(html.contains("lease &lt;x&gt; held twice"));
    }

    fn request(issued_s: f64, ended_s: f64, failure: Option<&str>) -> Request {
        Request {
            node: "a:1".into(),
            entity: "k1".into(),
            shard: "1".into(),
            issued: (issued_s * 1e9) as i64,
            ended: (ended_s * 1e9) as i64,
            failure: failure.map(String::from),
        }
    }

    #[test]
    fn the_load_strip_has_a_bar_per_second_and_marks_unanswered_requests() {
        let tl = timeline();
        let summary = Summary::default();
        let requests = vec![
            request(0.1, 0.2, None),
            request(0.3, 0.5, None),
            request(4.1, 9.1, Some("timeout")),
            request(5.0, 5.9, None),
        ];
        let html = render(&ReportInput {
            run: Vec::new(),
            timeline: &tl,
            summary: &summary,
            violations: &[],
            system: "tenure",
            scenario_end_ns: u64::MAX,
            requests: &requests,
        });
        let load = &html[html.find("<svg class=\"load\"").expect("a load strip")..];
        assert_eq!(
            load.matches("<rect class=\"acks\"").count(),
            10,
            "one bar per second"
        );
        assert!(load.contains("0 s: 2 acknowledged, 0 unanswered"), "{load}");
        assert!(load.contains("9 s: 0 acknowledged, 1 unanswered"), "{load}");
        assert_eq!(load.matches("<rect class=\"unanswered\"").count(), 1);
        // p99 points only where something was acknowledged: seconds 0 and 5.
        let points = load
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(points.split(' ').count(), 2, "{points}");
        assert!(
            load.contains("SIGKILL a:1"),
            "faults are marked on the strip"
        );
        assert!(load.contains("max 900 ms"), "{load}");
    }
}
