/* The physical floor of one exec probe run, in a process of its own: nothing here but the
 * loop. Built and run by benches/exec_cpu.rs (`cc -O2`), beside the real daemon.
 *
 *   spawn_floor MODE SCRIPT RUNS RATE [USER [CGROUP_DIR]]
 *
 * MODE spawn: posix_spawn (own process group, default signals, stdin /dev/null, stdout a
 *             pipe) + read to EOF + waitpid, as root or whoever runs it;
 * MODE fork:  fork + setgroups/setgid/setuid(USER) in the child + the same pipes, exec,
 *             read to EOF, waitpid: the credential switch the agent makes for run_as.
 * MODE contained: as fork, but clone3 with CLONE_INTO_CGROUP (CGROUP_DIR) and CLONE_PIDFD,
 *             setsid, a stderr pipe too, and the exit seen through the pidfd: the kernel
 *             work the agent's containment and supervision ask for, nothing of its runtime.
 * RATE runs a second, paced on absolute deadlines (CLOCK_MONOTONIC) as the daemon's timers
 * are, so the loop sleeps between runs as the daemon does; 0: back to back.
 *
 * Prints one line: runs, utime+stime of this process (getrusage RUSAGE_SELF, children
 * excluded) in microseconds, and its voluntary and involuntary context switches. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sched.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char *const envp[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};

static void die(const char *what) {
    perror(what);
    exit(2);
}

/* Read the child's stdout to EOF, then reap it; the run must have printed something and
 * exited 0. */
static void finish(int out, pid_t pid) {
    char buf[64];
    ssize_t n, got = 0;
    while ((n = read(out, buf, sizeof buf)) != 0) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("read");
        }
        got += n;
    }
    close(out);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            die("waitpid");
    if (got == 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "floor run failed: %zd bytes, status %d\n", got, status);
        exit(2);
    }
}

static void run_spawn(char *script) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        die("pipe2");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t all;
    sigfillset(&all);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
    char *argv[] = {script, NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, script, &fa, &attr, argv, envp);
    if (rc != 0) {
        errno = rc;
        die("posix_spawn");
    }
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(fds[1]);
    finish(fds[0], pid);
}

static uid_t uid;
static gid_t gid;
static gid_t groups[64];
static int ngroups = 64;

static void run_fork(char *script) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        die("pipe2");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (null < 0 || dup2(null, 0) < 0 || dup2(fds[1], 1) < 0 || setpgid(0, 0) != 0 ||
            setgroups(ngroups, groups) != 0 || setresgid(gid, gid, gid) != 0 ||
            setresuid(uid, uid, uid) != 0)
            _exit(126);
        char *argv[] = {script, NULL};
        execve(script, argv, envp);
        _exit(127);
    }
    close(fds[1]);
    finish(fds[0], pid);
}

static int cgroup_fd = -1;

static void run_contained(char *script) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
        die("pipe2");
    int pidfd = -1;
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_PIDFD | CLONE_INTO_CGROUP;
    args.pidfd = (unsigned long)&pidfd;
    args.exit_signal = SIGCHLD;
    args.cgroup = (unsigned long)cgroup_fd;
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid < 0)
        die("clone3");
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (null < 0 || setsid() < 0 || dup2(null, 0) < 0 || dup2(out[1], 1) < 0 ||
            dup2(err[1], 2) < 0 || setgroups(ngroups, groups) != 0 ||
            setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0)
            _exit(126);
        char *argv[] = {script, NULL};
        execve(script, argv, envp);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    char buf[64];
    while (read(err[0], buf, sizeof buf) > 0)
        ;
    close(err[0]);
    struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
    while (poll(&pfd, 1, -1) < 0)
        if (errno != EINTR)
            die("poll");
    close(pidfd);
    finish(out[0], (pid_t)pid);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: spawn_floor spawn|fork SCRIPT RUNS RATE [USER]\n");
        return 2;
    }
    int fork_mode = strcmp(argv[1], "fork") == 0;
    int contained = strcmp(argv[1], "contained") == 0;
    char *script = argv[2];
    long runs = atol(argv[3]);
    double rate = atof(argv[4]);
    if (contained) {
        if (argc < 7) {
            fprintf(stderr, "contained: USER and CGROUP_DIR needed\n");
            return 2;
        }
        cgroup_fd = open(argv[6], O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (cgroup_fd < 0)
            die(argv[6]);
    }
    if (fork_mode || contained) {
        struct passwd *pw = getpwnam(argc > 5 ? argv[5] : "nobody");
        if (!pw)
            die("getpwnam");
        uid = pw->pw_uid;
        gid = pw->pw_gid;
        if (getgrouplist(pw->pw_name, gid, groups, &ngroups) < 0)
            die("getgrouplist");
    }
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    long step_ns = rate > 0 ? (long)(1e9 / rate) : 0;
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    for (long i = 0; i < runs; i++) {
        if (step_ns) {
            next.tv_nsec += step_ns;
            while (next.tv_nsec >= 1000000000L) {
                next.tv_nsec -= 1000000000L;
                next.tv_sec++;
            }
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
                ;
        }
        if (contained)
            run_contained(script);
        else if (fork_mode)
            run_fork(script);
        else
            run_spawn(script);
    }
    getrusage(RUSAGE_SELF, &r1);
    long us = (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) * 1000000L +
              (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) +
              (r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1000000L +
              (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
    printf("runs %ld cpu_us %ld nvcsw %ld nivcsw %ld\n", runs, us, r1.ru_nvcsw - r0.ru_nvcsw,
           r1.ru_nivcsw - r0.ru_nivcsw);
    return 0;
}
