//! `format: munin`: what a Munin plugin prints for a fetch (munin-node runs it with no
//! argument): `field.value N` lines, `U` for a value the plugin could not read, and in a
//! multigraph plugin `multigraph NAME` lines opening each graph's block. A value may carry
//! its time (`field.value 1700000000:42`); the time is dropped.
//!
//! Samples: one per field, named `field` (or `NAME.field` inside `multigraph NAME`), with
//! the labels `field` and, in a multigraph block, `graph`. Without `select:` a resource named
//! like the field is fed by it (`provides: [load]`); `select:` names `field` or
//! `NAME.field`. Values are what the plugin printed: a DERIVE or COUNTER field (the `cpu`
//! plugin's jiffies) is the counter itself, not the rate munin's graphs draw.
//!
//! The environment munin-node gives a plugin is set the same way (each can be overridden in
//! the probe's `env:`): `MUNIN_LIBDIR` (the stock plugins source `$MUNIN_LIBDIR/plugins/
//! plugin.sh`), `MUNIN_PLUGSTATE` and `MUNIN_STATEFILE` (where a plugin keeps its state
//! between runs), `MUNIN_CONFDIR`, and `MUNIN_CAP_MULTIGRAPH=1` (the agent reads multigraph
//! output, so plugins that can print it do).

use super::{
    clip, Budget, FormatDef, Input, OutputError, Parsed, Peer, PeerRun, Sample,
};

pub const DEF: FormatDef = FormatDef::of_a_peer("munin", "Munin plugin output", parse, &PEER);

/// munin-node's defaults on Debian (`/etc/munin/munin-node.conf`, `munin-run`).
pub const LIBDIR: &str = "/usr/share/munin";

/// A plugin's state goes in the probe's own directory (`crate::probe::plugin_state`),
/// made for the user it runs as, where munin-node has one per user.
const PEER: Peer = Peer {
    state_dir: true,
    ..Peer::environment(env, &["field"])
};

fn env(run: &PeerRun) -> Vec<(String, String)> {
    let mut env = vec![
        ("MUNIN_LIBDIR", LIBDIR.to_owned()),
        ("MUNIN_CONFDIR", "/etc/munin".to_owned()),
        ("MUNIN_CAP_MULTIGRAPH", "1".to_owned()),
    ];
    if let Some(dir) = &run.state_dir {
        // munin-node names the file `<plugin>-<master>`; the agent's master is its host.
        let file = dir.join(format!("{}-{}", run.probe, run.host));
        env.push(("MUNIN_PLUGSTATE", dir.display().to_string()));
        env.push(("MUNIN_STATEFILE", file.display().to_string()));
    }
    env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

fn parse(input: &Input) -> Result<Parsed, OutputError> {
    let mut out = Parsed::default();
    let mut budget = Budget::for_output(input.text.len());
    let mut graph: Option<&str> = None;
    for (i, line) in input.text.lines().enumerate() {
        let number = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, rest) = line
            .split_once(char::is_whitespace)
            .map_or((line, ""), |(k, r)| (k, r.trim()));
        if key == "multigraph" {
            if rest.is_empty() || rest.contains(char::is_whitespace) {
                out.bad(number, format!("`multigraph` needs one graph name, got {rest:?}"));
                graph = None;
            } else {
                graph = Some(rest);
            }
            continue;
        }
        let Some((field, attribute)) = key.rsplit_once('.') else {
            out.bad(
                number,
                format!("expected `field.value N`, got {:?}", clip(line)),
            );
            continue;
        };
        if attribute != "value" {
            // `field.extinfo`, `graph_title`-style lines belong to `config`: not values.
            continue;
        }
        if field.is_empty() {
            out.bad(number, "a `.value` line with no field name");
            continue;
        }
        match field_value(rest) {
            Ok(value) => {
                // A long graph name is repeated in every field's name: counted.
                let s = sample(graph, field, value, number);
                budget
                    .charge_sample(&s)
                    .map_err(|reason| OutputError::Line {
                        line: number,
                        reason,
                    })?;
                out.samples.push(s);
            }
            Err(why) => out.bad(number, format!("field {field:?}: {why}")),
        }
    }
    if out.samples.is_empty() && out.bad_lines.is_empty() {
        return Err(OutputError::Empty);
    }
    Ok(out)
}

/// `42`, `-1.5e3`, `1700000000:42` (time dropped); `U` is unknown.
fn field_value(raw: &str) -> Result<&str, String> {
    let value = match raw.split_once(':') {
        Some((time, v)) if !time.is_empty() && time.bytes().all(|b| b.is_ascii_digit()) => v,
        _ => raw,
    };
    match value {
        "" => Err("no value after `.value`".into()),
        "U" => Err("is U: the plugin could not read it".into()),
        v if v.parse::<f64>().is_ok() => Ok(v),
        v => Err(format!("value {:?} is not a number", clip(v))),
    }
}

fn sample(graph: Option<&str>, field: &str, value: &str, line: usize) -> Sample {
    let mut labels = vec![("field".to_owned(), field.to_owned())];
    let name = match graph {
        Some(g) => {
            labels.push(("graph".to_owned(), g.to_owned()));
            format!("{g}.{field}")
        }
        None => field.to_owned(),
    };
    Sample {
        name,
        labels,
        value: value.to_owned(),
        line,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{bad_line_numbers, parse_ok, refused_at_budget};
    use super::*;

    fn values(p: &Parsed) -> Vec<(&str, &str)> {
        p.samples
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_str()))
            .collect()
    }

    #[test]
    fn plain_fields_and_multigraph_blocks() {
        let p = parse_ok(
            parse,
            "load.value 0.52\n\nmultigraph diskstats_io\nsda_rd.value 1700000000:12\nsda_wr.value 3\nmultigraph if_eth0\nup.value -4.5e1\n",
        );
        assert_eq!(
            values(&p),
            [
                ("load", "0.52"),
                ("diskstats_io.sda_rd", "12"),
                ("diskstats_io.sda_wr", "3"),
                ("if_eth0.up", "-4.5e1"),
            ]
        );
        assert!(p.bad_lines.is_empty(), "{:?}", p.bad_lines);
        assert_eq!(
            p.samples[1].labels,
            [
                ("field".to_owned(), "sda_rd".to_owned()),
                ("graph".to_owned(), "diskstats_io".to_owned())
            ]
        );
    }

    #[test]
    fn unknown_and_malformed_values_name_their_lines_and_keep_the_rest() {
        let p = parse_ok(
            parse,
            "a.value U\nb.value 2\ngarbage\nc.value two\nd.value\nmultigraph\ne.value 5\nf.extinfo fine\n",
        );
        assert_eq!(values(&p), [("b", "2"), ("e", "5")]);
        assert_eq!(bad_line_numbers(&p), [1, 3, 4, 5, 6]);
        assert!(p.bad_lines[0].to_string().contains("is U"), "{:?}", p.bad_lines);
    }

    #[test]
    fn a_long_graph_name_repeated_per_field_is_refused_at_the_budget() {
        let text = format!(
            "multigraph {}\n{}",
            "g".repeat(60_000),
            "a.value 1\n".repeat(20_000)
        );
        // Refused part way, not after the 20,000 fields.
        assert!((2..100).contains(&refused_at_budget(parse, &text)));
    }

    #[test]
    fn nothing_to_read_is_empty_output() {
        let e = parse(&Input {
            text: "# just a comment\n\n",
            exit: Some(0),
            own: "x",
        });
        assert_eq!(e, Err(OutputError::Empty));
    }

    #[test]
    fn munin_node_environment_names_the_state_file_per_probe() {
        let run = |state_dir: Option<&str>| {
            env(&PeerRun {
                probe: "cpu",
                host: "n1",
                interval: std::time::Duration::from_secs(300),
                state_dir: state_dir.map(Into::into),
            })
        };
        let env = run(Some("/var/lib/xce-agent/plugin-state/cpu"));
        assert!(env.contains(&("MUNIN_LIBDIR".into(), LIBDIR.into())));
        assert!(env.contains(&(
            "MUNIN_PLUGSTATE".into(),
            "/var/lib/xce-agent/plugin-state/cpu".into()
        )));
        assert!(env.contains(&(
            "MUNIN_STATEFILE".into(),
            "/var/lib/xce-agent/plugin-state/cpu/cpu-n1".into()
        )));
        // No state directory: no promise of one.
        assert!(!run(None).iter().any(|(k, _)| k.contains("STATE")));
    }
}
