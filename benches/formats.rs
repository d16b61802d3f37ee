//! Parsing and selecting a full-size probe output in each format against the floor any
//! parser pays: UTF-8 validation and finding the lines of the same bytes.
//! Run: `cargo bench --bench formats`.

use xce_agent::config::Format;
use xce_agent::output::{self, select, Pick};
use xce_agent::value::Valtype;

fn main() {
    divan::main();
}

/// The stdout cap: the largest output an exec probe can hand the parser.
const SIZE: usize = 64 * 1024;

fn fill(line: impl Fn(usize) -> String) -> String {
    let mut out = String::new();
    let mut i = 0;
    loop {
        let l = line(i);
        if out.len() + l.len() > SIZE {
            return out;
        }
        out.push_str(&l);
        i += 1;
    }
}

fn prometheus() -> String {
    fill(|i| {
        format!("node_directory_size_bytes{{directory=\"/data/project{i}\",fs=\"xfs\"}} {i}.5\n")
    })
}

fn influx() -> String {
    fill(|i| format!("disk,path=/data/p{i},fstype=xfs used_percent={i}.5,inodes={i}i\n"))
}

fn classad() -> String {
    fill(|i| format!("Project{i}UsedBytes = {i}\nProject{i}Ok = true\n"))
}

fn nagios() -> String {
    let mut out = String::from("DISK OK - all fine |");
    out.push_str(&fill(|i| format!(" '/data/p{i}'={i}MB;100;200;0;300")));
    out.push('\n');
    out
}

/// UTF-8 validation and line splitting of `text`: no parser reads less.
fn floor(text: &str) -> usize {
    let s = std::str::from_utf8(divan::black_box(text.as_bytes())).unwrap_or("");
    s.lines().count()
}

/// Parse, then pick one selected sample out of all of them (the last one: a full scan).
fn parse_and_select(format: Format, text: &str, selector: &str) -> bool {
    let parsed = output::parse(format, divan::black_box(text.as_bytes()), Some(0), "r").unwrap();
    let pick = Pick {
        selector: Some(output::parse_selector(selector).unwrap()),
        ..Pick::default()
    };
    select::reading(format, &pick, &parsed, "r", Valtype::Numeric).is_some()
}

#[divan::bench(args = ["prometheus", "influx", "classad", "nagios"])]
fn floor_lines(which: &str) -> usize {
    floor(input(which))
}

#[divan::bench(args = ["prometheus", "influx", "classad", "nagios"])]
fn parse_select(which: &str) -> bool {
    let text = input(which);
    let (format, selector) = match which {
        "prometheus" => (
            Format::Prometheus,
            "node_directory_size_bytes{directory=\"/data/project1\"}",
        ),
        "influx" => (Format::Influx, "disk.used_percent{path=\"/data/p1\"}"),
        "classad" => (Format::Classad, "Project1UsedBytes"),
        _ => (Format::Nagios, "/data/p1"),
    };
    parse_and_select(format, text, selector)
}

fn input(which: &str) -> &'static str {
    static INPUTS: std::sync::OnceLock<[String; 5]> = std::sync::OnceLock::new();
    let i = INPUTS.get_or_init(|| {
        [
            prometheus(),
            influx(),
            classad(),
            nagios(),
            classad_stream(),
        ]
    });
    match which {
        "prometheus" => &i[0],
        "influx" => &i[1],
        "classad" => &i[2],
        "classad_stream" => &i[4],
        _ => &i[3],
    }
}

/// A stream probe's ClassAd output: ads of ten attributes, each ended by `-`.
fn classad_stream() -> String {
    fill(|i| {
        let end = if i % 5 == 4 { "-\n" } else { "" };
        format!("Project{i}UsedBytes = {i}\nProject{i}Ok = true\n{end}")
    })
}

#[divan::bench]
fn floor_lines_classad_stream() -> usize {
    floor(input("classad_stream"))
}

/// What the stream supervisor does per line (without the store): each line into the
/// streaming reader, and at each `-` one selector read over the ad that ended.
#[divan::bench]
fn classad_stream_ads() -> usize {
    let pick = Pick {
        selector: Some(output::parse_selector("Project1UsedBytes").unwrap()),
        ..Pick::default()
    };
    let mut ads = output::AdStream::default();
    let mut found = 0;
    for line in divan::black_box(input("classad_stream")).lines() {
        if let output::AdLine::Ended { ad, .. } = ads.push(line) {
            let r = select::reading(Format::Classad, &pick, &ad, "r", Valtype::Numeric);
            found += usize::from(r.is_some());
        }
    }
    found
}
