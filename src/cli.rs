//! Command-line interface. The clap definition lives in the library so that the man page
//! and shell completions can be generated from it.

use std::path::{Path, PathBuf};

use clap::{Args, CommandFactory, FromArgMatches as _, Parser, Subcommand, ValueEnum};

use crate::config::{AGENT_YAML_ENV, DEFAULT_AGENT_YAML};

#[derive(Debug, Parser)]
#[command(
    name = "xce-agent",
    version,
    about = "Probe this host's dynamic resources and stream them to the xce controller",
    long_about = "Probe this host's dynamic resources (built-in load indices, admin scripts, files) \
                  as declared in resources.yaml, and stream their values to the xce controller.\n\n\
                  Without a subcommand it runs as the node daemon. `--once` runs every probe once \
                  and prints the values: the tool for debugging probes."
)]
pub struct Cli {
    #[command(flatten)]
    pub common: Common,

    /// Run every probe of this host once, print the values, and exit:
    /// 0 all ok, 1 some probe failed, 2 config error.
    #[arg(long)]
    pub once: bool,

    /// Output format of --once.
    #[arg(long, value_enum, default_value_t = OnceFormat::Table, requires = "once")]
    pub format: OnceFormat,

    /// With --once: run only these probes (resource names; repeat or comma-separate).
    #[arg(long, value_delimiter = ',', requires = "once")]
    pub only: Vec<String>,

    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Cli {
    /// The command line of this process, parsed; clap's error (and exit) for a bad one, and
    /// for a daemon option given to a command that does not read it.
    pub fn from_command_line() -> Cli {
        let matches = Cli::command().get_matches();
        let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        refuse_unread_options(&matches);
        cli
    }

    /// The options the command runs with: those given before it, with its own winning
    /// (`xce-agent -c A check -c B` reads B).
    pub fn effective_common(&self) -> Common {
        match &self.command {
            Some(Command::Check { args } | Command::Probe { args, .. }) => self.common.with(args),
            Some(Command::Status { config, .. }) => self.common.with_config(config),
            Some(Command::Listen { log, .. }) => Common {
                log_level: log.log_level.clone().or(self.common.log_level.clone()),
                ..self.common.clone()
            },
            _ => self.common.clone(),
        }
    }

    /// A command run by hand (everything but the daemon): it prints its results on stdout,
    /// and logs only warnings, on stderr.
    pub fn is_interactive(&self) -> bool {
        self.once || self.command.is_some()
    }
}

/// The daemon's options given before a subcommand that does not read them
/// (`xce-agent -c F listen ...`) are an error, as clap says one: its `--help` does not list
/// them, and an option that is silently ignored misleads.
fn refuse_unread_options(matches: &clap::ArgMatches) {
    let Some(sub) = matches.subcommand_name() else {
        return;
    };
    for (id, flag, readers) in COMMON_OPTIONS {
        if matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
            && !readers.contains(&sub)
        {
            let mut cmd = Cli::command();
            cmd.error(
                clap::error::ErrorKind::ArgumentConflict,
                format!("`{sub}` does not read {flag} (see `xce-agent {sub} --help`)"),
            )
            .exit();
        }
    }
}

/// The daemon's (and `--once`'s) files and logging. Given before a subcommand they also
/// reach `check`, `probe` and `status` (`xce-agent -c FILE probe NAME`), which take them after
/// their name too ([`ConfigArgs`]); the commands that read no configuration refuse them.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// agent.yaml to use.
    #[arg(long, short = 'c', env = AGENT_YAML_ENV, default_value = DEFAULT_AGENT_YAML)]
    pub config: PathBuf,

    /// resources.yaml to use instead of the one agent.yaml names.
    #[arg(long)]
    pub resources: Option<PathBuf>,

    /// Act as this host (default: agent.yaml's `host`, else the machine's host name).
    #[arg(long)]
    pub host: Option<String>,

    /// Log level or filter (error, warn, info, debug, trace; RUST_LOG syntax accepted).
    #[arg(long, env = "XCE_LOG")]
    pub log_level: Option<String>,
}

impl Common {
    /// These options with a subcommand's own, which win: `xce-agent -c A check -c B` reads B.
    pub fn with(&self, sub: &ConfigArgs) -> Common {
        Common {
            config: sub
                .config
                .config
                .clone()
                .unwrap_or_else(|| self.config.clone()),
            resources: sub.resources.clone().or_else(|| self.resources.clone()),
            host: sub.host.clone().or_else(|| self.host.clone()),
            log_level: sub.log.log_level.clone().or_else(|| self.log_level.clone()),
        }
    }

    /// With only a subcommand's `--config` (`status` reads nothing else).
    pub fn with_config(&self, sub: &ConfigFile) -> Common {
        Common {
            config: sub.config.clone().unwrap_or_else(|| self.config.clone()),
            ..self.clone()
        }
    }
}

/// `--config` after a subcommand's name (`status`).
#[derive(Debug, Clone, Args)]
pub struct ConfigFile {
    /// agent.yaml to use [default: $XCE_AGENT_CONFIG, else /etc/xce/agent.yaml].
    #[arg(long, short = 'c', value_name = "CONFIG")]
    pub config: Option<PathBuf>,
}

/// `--log-level` after a subcommand's name (`listen`, `check`, `probe`).
#[derive(Debug, Clone, Args)]
pub struct LogArg {
    /// Log level or filter (error, warn, info, debug, trace; RUST_LOG syntax accepted)
    /// [default: $XCE_LOG, else warn].
    #[arg(long, value_name = "LOG_LEVEL")]
    pub log_level: Option<String>,
}

/// What `check` and `probe` read, after their name: [`Common`]'s options.
#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub config: ConfigFile,

    /// resources.yaml to use instead of the one agent.yaml names.
    #[arg(long, value_name = "RESOURCES")]
    pub resources: Option<PathBuf>,

    /// Act as this host (default: agent.yaml's `host`, else the machine's host name).
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,

    #[command(flatten)]
    pub log: LogArg,
}

/// The ids of [`Common`]'s options, and the subcommands that read each (see
/// [`Cli::from_command_line`]).
pub const COMMON_OPTIONS: [(&str, &str, &[&str]); 4] = [
    ("config", "--config", &["check", "probe", "status"]),
    ("resources", "--resources", &["check", "probe"]),
    ("host", "--host", &["check", "probe"]),
    ("log_level", "--log-level", &["check", "probe", "listen"]),
];

/// `--once`'s output: the lsload-like table or JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnceFormat {
    Table,
    Json,
}

/// `status`'s output: the table or the daemon's answer as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate agent.yaml and resources.yaml and print this host's plan: what it probes,
    /// and why it skips the rest. Exit 0 when all is well, 1 when the files are valid but
    /// this host cannot run its plan as written, 2 when a file cannot be read, parsed or
    /// trusted.
    Check {
        #[command(flatten)]
        args: ConfigArgs,
    },
    /// Run one probe now, verbosely: argv, user, environment, exit, duration, output and the
    /// parsed value. Exit 0 when the probe succeeded.
    Probe {
        /// The resource whose probe to run.
        name: String,
        #[command(flatten)]
        args: ConfigArgs,
    },
    /// Show what the running daemon holds and sends: the link to the controller, then every
    /// resource's value, status, age, next run and error, read from its status socket
    /// (agent.yaml's `status_socket`). Exit 0 all ok, 1 a resource failed or is stale or the
    /// link is down, 2 cannot ask (permission denied, bad config), 3 the daemon is not running.
    Status {
        /// Output format.
        #[arg(long, value_enum, default_value_t = StatusFormat::Table)]
        format: StatusFormat,
        /// Redraw every second until interrupted.
        #[arg(long)]
        watch: bool,
        /// Only these resources.
        names: Vec<String>,
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Write the man pages and the bash, zsh and fish completions into DIR (packaging).
    #[command(hide = true, name = "generate-assets")]
    GenerateAssets {
        /// Output directory (created if missing): DIR/man/*.1 and *.5, DIR/completions/*.
        dir: PathBuf,
    },
    /// Reference receiver: accept agents' streams on ADDR and print every resval received.
    Listen {
        /// Address to listen on, e.g. 127.0.0.1:6870 (the controller's door; optional with
        /// --unix).
        #[arg(required_unless_present = "unix")]
        addr: Option<String>,
        /// The worker's door: the same protocol on a unix socket of this node, without TLS;
        /// a peer is known by its uid (SO_PEERCRED) and speaks for this host.
        #[arg(long, value_name = "PATH")]
        unix: Option<std::path::PathBuf>,
        /// Uids allowed on --unix (repeat; default root).
        #[arg(long = "unix-uid", value_name = "UID", requires = "unix")]
        unix_uids: Vec<u32>,
        /// `text`: a line per event; `json`: the same as JSON lines; `table`: the cluster
        /// as a table, a row per host and a column per resource.
        #[arg(long, value_enum, default_value_t = ListenFormat::Text)]
        format: ListenFormat,
        /// Acknowledge every batch.
        #[arg(long)]
        ack: bool,
        /// With --format table: only these resources' columns (repeat or comma-separate).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// With --format table: how often the table is redrawn (default 1s on a terminal,
        /// 10s otherwise).
        #[arg(long, value_parser = humantime::parse_duration)]
        refresh: Option<std::time::Duration>,
        #[command(flatten)]
        tls: ListenTls,
        #[command(flatten)]
        budget: ListenBudget,
        #[command(flatten)]
        log: LogArg,
    },
    /// A cluster CA for sites without a PKI: `tls init DIR`, then `tls issue`.
    Tls {
        #[command(subcommand)]
        command: TlsCommand,
    },
}

/// What `listen` may hold for its peers (see docs/protocol.md, "What a frame may cost").
#[derive(Debug, Clone, Args)]
pub struct ListenBudget {
    /// The receiver's memory budget: every connection, frame, event and host's state is
    /// charged to it (a size: 2GiB, 512MiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "2GiB")]
    pub memory_budget: u64,
    /// One host's share of the budget: a host over it is cut off (over_budget).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "8MiB")]
    pub host_share: u64,
}

/// A size as agent.yaml writes it (`8MiB`, `2GiB`, `65536`).
fn parse_size(s: &str) -> Result<u64, String> {
    crate::config::scalar::Scalar::Text(s.to_owned())
        .to_bytes()
        .map_err(|e| e.to_string())
}

/// How `listen` authenticates agents: TLS with client certificates, or `--insecure`.
#[derive(Debug, Clone, Args)]
pub struct ListenTls {
    /// CA bundle that signs the agents' certificates; a client certificate is required.
    #[arg(long, value_name = "FILE", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// This receiver's certificate (chain), PEM.
    #[arg(long, value_name = "FILE", requires = "tls_ca")]
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PKCS#8, SEC1 or RSA PEM; mode 0600).
    #[arg(long, value_name = "FILE", requires = "tls_ca")]
    pub tls_key: Option<PathBuf>,
    /// Revoked certificates, PEM.
    #[arg(long, value_name = "FILE", requires = "tls_ca")]
    pub tls_crl: Option<PathBuf>,
    /// The cluster's DNS domain (repeatable): a hello's short name `node001` is then named by
    /// a certificate SAN `node001.DOMAIN`. Without it a SAN must equal the hello's host.
    #[arg(long = "domain", value_name = "DOMAIN", requires = "tls_ca")]
    pub domains: Vec<String>,
    /// Accept plaintext agents: anyone who can reach ADDR can report values for any host.
    #[arg(long, conflicts_with = "tls_ca")]
    pub insecure: bool,
}

#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// Make a cluster CA (ECDSA P-256): DIR/ca.pem and DIR/ca.key (0600, DIR 0700).
    Init {
        dir: PathBuf,
        /// Validity of the CA certificate.
        #[arg(long, default_value_t = crate::tls_ca::DEFAULT_CA_DAYS,
              value_parser = clap::value_parser!(u32).range(1..=36_500))]
        days: u32,
    },
    /// Issue a certificate and key per host (OUT/NAME.pem, OUT/NAME.key 0600), signed by
    /// the CA in --ca. NAMES use the hostlist syntax of resources.yaml: node[001-128].
    Issue {
        /// Directory made by `tls init`.
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
        /// Where to write the certificates and keys.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Also name NAME.DOMAIN in each certificate (its FQDN).
        #[arg(long)]
        domain: Option<String>,
        /// Validity of each certificate.
        #[arg(long, default_value_t = crate::tls_ca::DEFAULT_HOST_DAYS,
              value_parser = clap::value_parser!(u32).range(1..=36_500))]
        days: u32,
        #[arg(required = true, value_name = "NAMES")]
        names: Vec<String>,
    },
}

/// `listen`'s output: its own formats, not `--once`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ListenFormat {
    Text,
    Json,
    Table,
}

/// Generate the man pages (one per visible subcommand, `xce-agent.1` first, and the two
/// files' section-5 pages, `xce-agent.yaml.5` and `xce-resources.yaml.5`) into
/// `dir/man` and the shell completions into `dir/completions`, from this very definition,
/// so they never drift from the binary. Returns the files written.
pub fn generate_assets(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    use clap_complete::Shell;
    let man = dir.join("man");
    let completions = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let cmd = Cli::command();
    clap_mangen::generate_to(cmd.clone(), &man)?;
    std::fs::write(
        man.join("xce-agent.yaml.5"),
        crate::render::man::agent_yaml(),
    )?;
    std::fs::write(
        man.join("xce-resources.yaml.5"),
        crate::render::man::resources_yaml(),
    )?;
    let mut written = Vec::new();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        written.push(clap_complete::generate_to(
            shell,
            &mut cmd.clone(),
            "xce-agent",
            &completions,
        )?);
    }
    for entry in std::fs::read_dir(&man)? {
        written.push(entry?.path());
    }
    written.sort();
    Ok(written)
}
