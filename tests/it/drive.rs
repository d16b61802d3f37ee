//! The one child driver (`child::drive`) that exec runs, streams and first values share:
//! each way a run ends, table-tested on real children, with the exit each leaves.

use std::ffi::OsString;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use xce_agent::probe::child::{self, AfterExit, Child, ChildSpec, Ended, Event, Exit, Flow, Watch};

/// What the caller answers, per case.
#[derive(Clone, Copy)]
enum Caller {
    /// Reads on to the end.
    ReadsOn,
    /// Has what it wants at the first stdout.
    StopsAtFirstOutput,
    /// Restarts a silent child.
    StopsWhenSilent,
}

struct Case {
    name: &'static str,
    script: &'static str,
    stdout_cap: usize,
    stdin_pipe: bool,
    deadline: Duration,
    silence: Option<Duration>,
    after_exit: AfterExit,
    cancelled: bool,
    goodbye: Option<&'static [u8]>,
    caller: Caller,
    want: (Ended, bool, Exit),
}

const BASE: Case = Case {
    name: "",
    script: "",
    stdout_cap: 64 * 1024,
    stdin_pipe: false,
    deadline: Duration::from_secs(60),
    silence: None,
    after_exit: AfterExit::ReadToDeadline,
    cancelled: false,
    goodbye: None,
    caller: Caller::ReadsOn,
    want: (Ended::Exited, false, Exit::Code(0)),
};

const TERM: i32 = libc::SIGTERM;
const KILL: i32 = libc::SIGKILL;

#[tokio::test]
async fn each_way_a_driven_run_ends() {
    let cases = [
        Case {
            name: "exits by itself",
            script: "echo hi",
            want: (Ended::Exited, false, Exit::Code(0)),
            ..BASE
        },
        Case {
            name: "the deadline: SIGTERM ends it in its grace",
            script: "exec sleep 1000",
            deadline: Duration::from_millis(100),
            want: (Ended::Deadline, false, Exit::Signal(TERM)),
            ..BASE
        },
        Case {
            name: "the deadline: SIGTERM ignored, SIGKILL after the grace",
            script: "trap '' TERM; while :; do sleep 0.05; done",
            deadline: Duration::from_millis(100),
            want: (Ended::Deadline, true, Exit::Signal(KILL)),
            ..BASE
        },
        Case {
            name: "more stdout than the cap",
            script: "exec yes",
            stdout_cap: 1000,
            want: (Ended::Overflow, false, Exit::Signal(TERM)),
            ..BASE
        },
        Case {
            name: "cancelled",
            script: "exec sleep 1000",
            cancelled: true,
            want: (Ended::Cancelled, false, Exit::Signal(TERM)),
            ..BASE
        },
        Case {
            name: "the caller has what it wants",
            script: "echo ready; exec sleep 1000",
            caller: Caller::StopsAtFirstOutput,
            want: (Ended::Stopped, false, Exit::Signal(TERM)),
            ..BASE
        },
        Case {
            name: "a goodbye on stdin: it exits by itself in the grace",
            script: "echo ready; read x; [ \"$x\" = quit ] && exit 7; exec sleep 1000",
            stdin_pipe: true,
            goodbye: Some(b"quit\n"),
            caller: Caller::StopsAtFirstOutput,
            want: (Ended::Stopped, false, Exit::Code(7)),
            ..BASE
        },
        Case {
            name: "silence, and the caller restarts it",
            script: "exec sleep 1000",
            silence: Some(Duration::from_millis(100)),
            caller: Caller::StopsWhenSilent,
            want: (Ended::Stopped, false, Exit::Signal(TERM)),
            ..BASE
        },
        Case {
            name: "a stream's leader exits: a background process holding its output is not waited for",
            script: "sleep 1000 & echo x",
            after_exit: AfterExit::EndTheRest,
            want: (Ended::Exited, false, Exit::Code(0)),
            ..BASE
        },
        Case {
            name: "an exec run's leader exits: a background process holding its output makes it a timeout",
            script: "sleep 1000 & echo x",
            deadline: Duration::from_millis(200),
            want: (Ended::Deadline, false, Exit::Code(0)),
            ..BASE
        },
    ];
    for case in cases {
        let mut spec = ChildSpec::new("/bin/sh", case.deadline);
        spec.args = vec![OsString::from("-c"), OsString::from(case.script)].into();
        spec.stdout_cap = case.stdout_cap;
        spec.stdin_pipe = case.stdin_pipe;
        spec.grace = Duration::from_millis(300);
        let (mut child, mut reader) = Child::start(&spec).expect("spawn");
        let cancel = CancellationToken::new();
        if case.cancelled {
            cancel.cancel();
        }
        let watch = Watch {
            cancel: Some(&cancel),
            silence: case.silence,
            after_exit: case.after_exit,
            goodbye: case.goodbye,
            ..Watch::run_until(Instant::now() + case.deadline, spec.grace)
        };
        let caller = case.caller;
        let driven = child::drive(&mut child, &mut reader, &watch, |event| {
            match (caller, event) {
                (Caller::StopsAtFirstOutput, Event::Stdout(_)) => Flow::Stop,
                (Caller::StopsWhenSilent, Event::Silent) => Flow::Stop,
                _ => Flow::Continue,
            }
        })
        .await;
        let (ended, killed, exit) = case.want;
        assert_eq!(
            (driven.ended, driven.killed, child.exit()),
            (ended, killed, Some(exit)),
            "{}",
            case.name
        );
    }
}
