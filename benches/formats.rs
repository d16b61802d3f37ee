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

fn munin() -> String {
    let mut out = String::from("multigraph diskstats\n");
    out.push_str(&fill(|i| format!("data_p{i}.value {i}.5\n")));
    out
}

fn checkmk() -> String {
    fill(|i| format!("P \"Disk p{i}\" used={i}.5;80;90;0;100|inodes={i} fine\n"))
}

fn collectd() -> String {
    fill(|i| format!("PUTVAL \"n1/df-data_p{i}/percent_bytes-used\" interval=60 N:{i}.5\n"))
}

/// A chart of as many dimensions as fill half the cap, then one update of all of them.
fn netdata() -> String {
    let n = SIZE / 2 / "DIMENSION p0000 '' absolute 1 1000\n".len();
    let mut out = String::from("CHART disk.used '' 'Used' '%' disk disk.used line 1 1\n");
    for i in 0..n {
        out.push_str(&format!("DIMENSION p{i} '' absolute 1 1000\n"));
    }
    out.push_str("BEGIN disk.used\n");
    for i in 0..n {
        out.push_str(&format!("SET p{i} = {i}500\n"));
    }
    out.push_str("END\n");
    out
}

fn sge() -> String {
    let mut out = String::from("begin\n");
    out.push_str(&fill(|i| format!("global:data_p{i}:{i}.5\n")));
    out.push_str("end\n");
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

const FORMATS: &[&str] = &[
    "prometheus",
    "influx",
    "classad",
    "nagios",
    "munin",
    "checkmk",
    "collectd",
    "netdata",
    "sge",
];

#[divan::bench(args = FORMATS)]
fn floor_lines(which: &str) -> usize {
    floor(input(which))
}

#[divan::bench(args = FORMATS)]
fn parse_select(which: &str) -> bool {
    let text = input(which);
    let (format, selector) = match which {
        "prometheus" => (
            Format::Prometheus,
            "node_directory_size_bytes{directory=\"/data/project1\"}",
        ),
        "influx" => (Format::Influx, "disk.used_percent{path=\"/data/p1\"}"),
        "classad" => (Format::Classad, "Project1UsedBytes"),
        "munin" => (Format::Munin, "diskstats.data_p1"),
        "checkmk" => (Format::Checkmk, "used{service=\"Disk p1\"}"),
        "collectd" => (Format::Collectd, "df-data_p1/percent_bytes-used"),
        "netdata" => (Format::Netdata, "disk.used.p1"),
        "sge" => (Format::Sge, "data_p1{host=\"global\"}"),
        _ => (Format::Nagios, "/data/p1"),
    };
    parse_and_select(format, text, selector)
}

fn input(which: &str) -> &'static str {
    static INPUTS: std::sync::OnceLock<[String; 10]> = std::sync::OnceLock::new();
    let i = INPUTS.get_or_init(|| {
        [
            prometheus(),
            influx(),
            classad(),
            nagios(),
            classad_stream(),
            munin(),
            checkmk(),
            collectd(),
            netdata(),
            sge(),
        ]
    });
    match which {
        "prometheus" => &i[0],
        "influx" => &i[1],
        "classad" => &i[2],
        "classad_stream" => &i[4],
        "munin" => &i[5],
        "checkmk" => &i[6],
        "collectd" => &i[7],
        "netdata" => &i[8],
        "sge" => &i[9],
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
