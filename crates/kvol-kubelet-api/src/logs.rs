//! `containerLogs` as kubelet answers it: the runtime's log file (CRI's `<time> <stream> <F|P> <text>` lines) turned back into what the container wrote, with `tailLines`, `timestamps`, `sinceSeconds`/`sinceTime` and `limitBytes`; pure.

/// The query's options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<usize>,
    pub limit_bytes: Option<usize>,
    /// Lines written before this (RFC 3339, as the log's times are) are left out.
    pub since: Option<String>,
}

impl LogOptions {
    /// From a query string (`follow=true&tailLines=10`); `now` turns `sinceSeconds` into a time.
    pub fn parse(query: &str, now: impl Fn(u64) -> String) -> Result<LogOptions, String> {
        let mut options = LogOptions::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
            let number = |v: &str| v.parse::<usize>().map_err(|_| format!("{key}: {v:?} is not a number"));
            match key {
                "follow" => options.follow = value == "true",
                "previous" => options.previous = value == "true",
                "timestamps" => options.timestamps = value == "true",
                "tailLines" => options.tail_lines = Some(number(value)?),
                "limitBytes" => options.limit_bytes = Some(number(value)?),
                "sinceSeconds" => options.since = Some(now(number(value)? as u64)),
                "sinceTime" => options.since = Some(value.replace("%3A", ":")),
                _ => {}
            }
        }
        Ok(options)
    }
}

/// One line of the runtime's log, whole (its partial pieces joined).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Line<'a> {
    time: &'a str,
    text: String,
}

fn lines(log: &str) -> Vec<Line<'_>> {
    let mut out: Vec<Line<'_>> = Vec::new();
    let mut partial: Option<Line<'_>> = None;
    for raw in log.lines() {
        let mut fields = raw.splitn(4, ' ');
        let (Some(time), Some(_stream), Some(tag)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let text = fields.next().unwrap_or_default();
        let line = partial.get_or_insert_with(|| Line { time, text: String::new() });
        line.text.push_str(text);
        if tag != "P" {
            out.extend(partial.take());
        }
    }
    out.extend(partial);
    out
}

/// An RFC 3339 UTC time as a comparable pair: its seconds and its fraction in nanoseconds
/// (`10:00:01.2Z` is after `10:00:01Z`, which text order gets wrong).
fn instant(time: &str) -> (&str, u64) {
    let (seconds, rest) = time.split_at(time.len().min(19));
    let digits = rest.trim_start_matches('.').trim_end_matches('Z');
    let fraction = format!("{digits:0<9}").get(..9).and_then(|d| d.parse().ok()).unwrap_or(0);
    (seconds, fraction)
}

/// What the client is sent of `log`.
pub fn render(log: &str, options: &LogOptions) -> String {
    let mut kept: Vec<Line<'_>> = lines(log)
        .into_iter()
        .filter(|l| options.since.as_deref().is_none_or(|since| instant(l.time) >= instant(since)))
        .collect();
    if let Some(tail) = options.tail_lines {
        kept.drain(..kept.len().saturating_sub(tail));
    }
    let mut out = String::new();
    for line in kept {
        if options.timestamps {
            out.push_str(line.time);
            out.push(' ');
        }
        out.push_str(&line.text);
        out.push('\n');
    }
    if let Some(limit) = options.limit_bytes.filter(|l| *l < out.len()) {
        let mut cut = limit;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026-12-07T10:00:00.1Z stdout F one\n2026-12-07T10:00:01.2Z stderr P tw\n2026-12-07T10:00:01.3Z stderr F o\n2026-12-07T10:00:02.5Z stdout F three\n";

    #[test]
    fn logs_as_kubelet_sends_them() {
        let at = |q: &str| LogOptions::parse(q, |s| format!("2026-12-07T10:00:0{}Z", 3 - s)).unwrap();
        // (query, answer)
        let cases = [
            ("", "one\ntwo\nthree\n"),
            ("tailLines=2", "two\nthree\n"),
            ("tailLines=0", ""),
            ("timestamps=true&tailLines=1", "2026-12-07T10:00:02.5Z three\n"),
            ("sinceSeconds=2", "two\nthree\n"),
            ("sinceTime=2026-12-07T10%3A00%3A02Z", "three\n"),
            ("limitBytes=6", "one\ntw"),
        ];
        for (query, want) in cases {
            assert_eq!(render(LOG, &at(query)), want, "{query}");
        }
        assert!(LogOptions::parse("tailLines=x", |_| String::new()).is_err());
        assert!(at("follow=true&previous=true").follow && at("previous=true").previous);
    }
}
