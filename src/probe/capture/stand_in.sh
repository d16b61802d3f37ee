#!/bin/sh
# A stand-in written by xce-agent for a probe with `capture:`; rewritten at each start, so
# edits here are lost. A call that changes what the scheduler knows of this node is written
# to descriptor @FD@ for the agent, which reads it as the probe's values, and never reaches
# the real command; a call that only reads runs the real command further down PATH.
tool=${0##*/}
here=${0%/*}
# Every stand-in lives below this; the real command is looked for outside it.
stand_ins=${here%/*}

real() {
    rest=$PATH
    while [ -n "$rest" ]; do
        dir=${rest%%:*}
        case $rest in
        *:*) rest=${rest#*:} ;;
        *) rest= ;;
        esac
        case $dir in
        "" | "$stand_ins" | "$stand_ins"/*) continue ;;
        esac
        if [ -f "$dir/$tool" ] && [ -x "$dir/$tool" ]; then
            exec "$dir/$tool" "$@"
        fi
    done
    echo "$tool: not found on PATH (xce-agent's capture passes only calls that read to it)" >&2
    exit 127
}

# One record: the command, the number of arguments, the arguments, each ended by a NUL.
record() {
    # A script that redirected descriptor @FD@ itself would get the record instead.
    if [ -d /dev/fd ] && ! [ -p /dev/fd/@FD@ ]; then
        echo "$tool: descriptor @FD@ is not xce-agent's capture pipe (did the script redirect it?); nothing was reported" >&2
        exit 1
    fi
    if ! printf '%s\0' "$tool" "$#" "$@" >&@FD@; then
        echo "$tool: cannot report to xce-agent on descriptor @FD@; nothing was reported" >&2
        exit 1
    fi
    exit 0
}

refuse() {
    echo "$tool${1:+ $1}: not passed on by xce-agent's capture: $2" >&2
    exit 1
}

case $tool in
scontrol)
    # The first word that is not an option is the command (-M takes a value).
    skip=
    for a in "$@"; do
        if [ -n "$skip" ]; then
            skip=
            continue
        fi
        case $a in
        -M | --clusters) skip=1 ;;
        -*) ;;
        [Uu][Pp][Dd][Aa][Tt][Ee]) record "$@" ;;
        [Ss][Hh][Oo][Ww] | [Pp][Ii][Nn][Gg] | [Vv][Ee][Rr][Ss][Ii][Oo][Nn] | [Hh][Ee][Ll][Pp] | listpids | pidinfo) real "$@" ;;
        *) refuse "$a" "only update is captured, and show, ping, version, help, listpids and pidinfo reach scontrol" ;;
        esac
    done
    case " $* " in
    *" -V "* | *" --version "* | *" -h "* | *" --help "* | *" --usage "*) real "$@" ;;
    esac
    # Without a command scontrol reads its commands from stdin, where an update would reach
    # the real node unseen.
    refuse "" "without a command scontrol reads commands from stdin, which capture cannot see"
    ;;
pbsnodes)
    # -o offline, -c and -r clear, -C/-N/-A set a comment or note: captured. The rest reads.
    for a in "$@"; do
        case $a in
        --*) ;;
        -*[ocrCNA]*) record "$@" ;;
        esac
    done
    real "$@"
    ;;
gmetric)
    case ${1-} in
    -h | --help | -V | --version) real "$@" ;;
    esac
    record "$@"
    ;;
*)
    echo "$tool: xce-agent has no stand-in of this name" >&2
    exit 127
    ;;
esac
