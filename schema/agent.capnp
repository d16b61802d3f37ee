# xce-agent wire protocol: what the worker-side agent streams to the controller.
#
# Transport: one TCP connection per agent, initiated by the agent (default controller port 6870).
# Framing: the standard Cap'n Proto stream framing (capnp::serialize / kj
# writeMessage / readMessage, no packing), in both directions.
#   agent -> controller: a sequence of `Envelope` messages.
#   controller -> agent: a sequence of `ControllerMessage` messages (optional; a controller
#                        that never sends anything is valid).
# Message order on every connection (see docs/protocol.md for the full rules):
#   hello, batch(full=true), { batch(full=false) | heartbeat }*
#   and again hello, batch(full=true) whenever the agent's declared set changes.
# Unknown fields: a reader must ignore fields and union members it does not know, so the
# agent can add fields without breaking older controllers (normal capnp evolution rules).
#
# Readable from C (c-capnproto) and C++: no generics, no interfaces, only plain structs,
# enums, lists and unions.

@0xf6bf33be0ab08830;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("xce::agent");

const protocolVersion :UInt16 = 2;
# Version of this protocol. Incremented only on an incompatible change; a controller that
# receives a hello with a protocolVersion it does not speak closes the connection.
#   1: hello, batch, heartbeat; welcome, ack.
#   2: + accepted and refused (the controller's verdict on a connection). A controller that
#      speaks 2 also accepts version-1 hellos and sends those agents no verdict (a version-1
#      agent drops a connection on a controller message it does not know). Upgrade the
#      controllers before the agents: a version-1 controller closes a version-2 hello.

enum Valtype {
  # The LSF value type of a resource, as declared in resources.yaml.
  numeric @0;   # 64-bit float.
  string @1;    # UTF-8 text, no control characters.
  boolean @2;   # true / false.
}

enum Status {
  # How much the agent trusts a resval right now.
  ok @0;        # The last probe run gave a good value; `value` is current.
  failed @1;    # The last run failed (`error` says why). `value` is the last good value
                # while it is still fresh, and `unknown` once it is stale.
  stale @2;     # No fresh reading for longer than the resource's stale time; `value` is unknown.
  pending @3;   # No reading yet (agent just started, or a rate that needs a second sample).
}

struct Declared {
  # One resource instance this agent reports, announced in `Hello`.
  name @0 :Text;          # Resource name as in resources.yaml (LSF rules, <= 39 chars).
  instance @1 :Text;      # "" = this host's own instance (resourcemap `default`). Otherwise
                          # the shared instance's location as written in resources.yaml
                          # (e.g. "all", "others", "node[001-004]"), which the controller
                          # reads from the same file.
  valtype @2 :Valtype;    # The declared value type; every value sent for it has this type
                          # (or is unknown).
  intervalMs @3 :UInt64;  # Probe interval in milliseconds (> 0: the resource is dynamic).
  shared @4 :Bool;        # True when `instance` is a shared instance (one value for several
                          # hosts), reported by this host because it is the first listed host
                          # or because the controller assigned it in `Welcome`.
}

struct Hello {
  # First message on every connection, and again when the agent reloads its configuration.
  protocolVersion @0 :UInt16;  # Always `protocolVersion` above.
  host @1 :Text;               # The host name this agent reports for (as in hosts.yaml).
  agentVersion @2 :Text;       # The agent's version string, for logs.
  bootId @3 :Text;             # /proc/sys/kernel/random/boot_id: changes when the host reboots.
  configDigest @4 :Text;       # Digest of the agent's effective resource configuration; two
                               # agents with the same digest probe the same things.
  resources @5 :List(Declared);  # Every resource instance this agent will report. A following
                                 # full batch carries exactly these (name, instance) pairs.
}

struct Resval {
  # The latest state of one resource instance.
  name @0 :Text;          # Resource name; never empty.
  instance @1 :Text;      # "" for this host's own instance; see Declared.instance.
  value :union {
    # The value. `unknown` is what LSF shows as "-": there is no value the agent vouches for.
    unknown @2 :Void;     # Default (first) member: a zeroed Resval reads as unknown.
    numeric @3 :Float64;  # Finite; for valtype numeric.
    string @4 :Text;      # For valtype string.
    boolean @5 :Bool;     # For valtype boolean.
  }
  status @6 :Status;      # See Status.
  lastReportMs @7 :UInt64;  # Unix time in ms of the last good reading; 0 = never.
  error @8 :Text;         # Why the status is not ok ("" when ok): a failed probe's stderr
                          # tail or exit reason, the staleness reason, etc.
}

struct Batch {
  # A set of resvals. A full batch is a complete snapshot; a delta carries only the resvals
  # that changed since the previous batch on this connection.
  seq @0 :UInt64;         # 1, 2, 3, ... per connection, shared with heartbeats' view;
                          # strictly increasing, never reused on one connection.
  full @1 :Bool;          # True: a snapshot; every declared instance is present, and any
                          # instance the controller knew from this host but absent here is gone.
                          # False: a delta; instances not in it are unchanged.
  sentAtMs @2 :UInt64;    # Unix time in ms when the agent built this batch.
  resvals @3 :List(Resval);
}

struct Heartbeat {
  # Sent when no batch was sent for the heartbeat interval: everything the controller holds
  # from this host is still current as of sentAtMs.
  seq @0 :UInt64;         # seq of the last batch sent on this connection.
  sentAtMs @1 :UInt64;    # Unix time in ms when it was sent.
}

struct Envelope {
  # Every message from agent to controller.
  union {
    hello @0 :Hello;
    batch @1 :Batch;
    heartbeat @2 :Heartbeat;
  }
}

struct Instance {
  # One (resource, instance) pair.
  name @0 :Text;          # Resource name.
  instance @1 :Text;      # Shared instance location as in resources.yaml.
}

struct Welcome {
  # The shared instances the controller assigns to this host. Replaces any earlier
  # assignment; an empty list withdraws them all. May be sent at any time (failover: the
  # host that probed an instance went away).
  assigned @0 :List(Instance);
}

struct Ack {
  # The controller has applied every batch up to and including `seq`.
  seq @0 :UInt64;
}

struct Accepted {
  # (Version 2.) The controller checked the hello (protocol version, names, and the host
  # against the client certificate) and takes this connection's values. Sent after each
  # hello it accepts, before any other reply to it.
  host @0 :Text;          # The host the connection is accepted as.
}

struct Refused {
  # (Version 2.) The controller will not take this connection, and closes it after this.
  # The agent logs it once and backs off before trying again.
  reason @0 :Text;        # A short label: identity, protocol, limit (more may come).
  message @1 :Text;       # Why, in words, for the agent's log.
}

struct ControllerMessage {
  # Every message from controller to agent.
  union {
    welcome @0 :Welcome;
    ack @1 :Ack;
    accepted @2 :Accepted;   # Version 2.
    refused @3 :Refused;     # Version 2.
  }
}
