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
 * MODE replay: the system calls the daemon makes for one exec run (strace of its worker
 *             threads, section 23i), in the daemon's order and nothing else: four statx (the
 *             script rule), two pipe2 (O_NONBLOCK), the signal mask around a clone3 with
 *             CLONE_VM (no CLONE_VFORK: the child on a stack of its own), CLONE_PIDFD,
 *             CLONE_CHILD_CLEARTID and CLONE_INTO_CGROUP (a leaf of CGROUP_DIR per run in
 *             flight, its directory and cgroup.events held open as the daemon holds them),
 *             the pidfd registered with epoll, up to BATCH (8, max_parallel) runs in flight
 *             and one epoll_wait for whatever has ended, then per run: waitid WNOWAIT, the
 *             pipes read to EOF and closed, the group killed, cgroup.events read, wait4, the
 *             pidfd removed and closed, two clock_gettime(CLOCK_THREAD_CPUTIME_ID). The
 *             descriptor table is filled to FDS (the daemon's count) first: clone3 copies
 *             it. RATE: that many runs released together once a second (the daemon's probes
 *             at 1 s under `spread: host`), the next second's wait in clock_nanosleep.
 *             What is left between this and the daemon is its runtime: tokio, the run's
 *             bookkeeping, the parse, the store.
 *             spawn_floor replay SCRIPT RUNS RATE USER CGROUP_DIR FDS [BATCH]
 * MODE replay-files: replay, but the clone shares the descriptor table (CLONE_FILES) and the
 *             child's first call unshares only the descriptors below its own highest one
 *             (close_range(K, ~0, CLOSE_RANGE_UNSHARE)); the parent closes its copies of the
 *             child's pipe ends once the child has exited, and the FDS descriptors standing
 *             for the daemon's held ones sit at 4096 and above, out of the child's copy.
 *             What the daemon's runs would cost with that spawn (not what it does today).
 * RATE runs a second, paced on absolute deadlines (CLOCK_MONOTONIC) as the daemon's timers
 * are, so the loop sleeps between runs as the daemon does; 0: back to back.
 *
 * Prints one line: runs, utime+stime of this process (getrusage RUSAGE_SELF, children
 * excluded) in microseconds, its utime alone, and its voluntary and involuntary context
 * switches. */
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
#include <linux/close_range.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
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

/* Read a pipe to EOF (its write ends gone with the child) and close it; the bytes read. */
static ssize_t drain(int fd) {
    char buf[512];
    ssize_t n, got = 0;
    while ((n = read(fd, buf, sizeof buf)) != 0) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) { /* a grandchild holds it: not in this floor */
                struct pollfd p = {.fd = fd, .events = POLLIN};
                poll(&p, 1, -1);
                continue;
            }
            die("read");
        }
        got += n;
    }
    close(fd);
    return got;
}

/* Read the child's stdout to EOF, then reap it; the run must have printed something and
 * exited 0. */
static void finish(int out, pid_t pid) {
    ssize_t got = drain(out);
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
    drain(err[0]);
    struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
    while (poll(&pfd, 1, -1) < 0)
        if (errno != EINTR)
            die("poll");
    close(pidfd);
    finish(out[0], (pid_t)pid);
}

/* ---- replay: the daemon's system calls for a run, nothing else ---- */

#define MAX_BATCH 64
#define CHILD_STACK (64 * 1024)

struct replay_run {
    int busy;
    pid_t pid;
    int pidfd, out, err, out_w, err_w;
    int leaf_dir, leaf_events;
    volatile unsigned int in_our_memory; /* CLONE_CHILD_CLEARTID */
    char *stack;
};

static struct replay_run slots[MAX_BATCH];
/* replay-files: CLONE_FILES, the child unsharing the low descriptors only. */
static int shared_files;
static int epfd = -1;
static char *replay_script, *replay_dir;

/* The child, on its own stack, sharing this process's memory until execve: raw system calls
 * only (syscall() stores errno on failure only, and then the child exits). */
static int replay_child(void *arg) {
    struct replay_run *r = arg;
    if (shared_files) {
        /* Before anything else touches the table it shares with the parent: a copy of its
         * own, of the descriptors up to its highest pipe end only. */
        unsigned int k = (unsigned int)(r->out_w > r->err_w ? r->out_w : r->err_w) + 1;
        if (syscall(SYS_close_range, k, ~0U, CLOSE_RANGE_UNSHARE) != 0)
            syscall(SYS_exit_group, 125);
    }
    int null = (int)syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0 || syscall(SYS_setsid) < 0 || syscall(SYS_dup2, null, 0) < 0 ||
        syscall(SYS_dup2, r->out_w, 1) < 0 || syscall(SYS_dup2, r->err_w, 2) < 0 ||
        syscall(SYS_fcntl, 1, F_SETFL, 0) < 0 || syscall(SYS_fcntl, 2, F_SETFL, 0) < 0 ||
        syscall(SYS_setgroups, ngroups, groups) != 0 ||
        syscall(SYS_setresgid, gid, gid, gid) != 0 || syscall(SYS_setresuid, uid, uid, uid) != 0)
        syscall(SYS_exit_group, 126);
    sigset_t none;
    sigemptyset(&none);
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
    char *argv[] = {replay_script, NULL};
    syscall(SYS_execve, replay_script, argv, envp);
    syscall(SYS_exit_group, 127);
    return 0;
}

/* clone3 with CLONE_VM onto `stack`: the child calls fn(arg) there and never returns. */
static long clone3_on_stack(struct clone_args *args, int (*fn)(void *), void *arg) {
    long ret;
    register void *r12 __asm__("r12") = (void *)fn;
    register void *r13 __asm__("r13") = arg;
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "xor %%ebp, %%ebp\n\t"
                     "mov %%r13, %%rdi\n\t"
                     "call *%%r12\n\t"
                     "mov $127, %%edi\n\t"
                     "mov $231, %%eax\n\t"
                     "syscall\n\t"
                     "1:\n\t"
                     : "=a"(ret)
                     : "a"((long)SYS_clone3), "D"(args), "S"(sizeof *args), "r"(r12), "r"(r13)
                     : "rcx", "r11", "memory");
    return ret;
}

static void replay_start(struct replay_run *r) {
    struct statx st;
    /* The script rule: the script and its directory, the interpreter and its directory. */
    if (statx(AT_FDCWD, replay_script, AT_STATX_SYNC_AS_STAT, STATX_ALL, &st) != 0 ||
        statx(AT_FDCWD, replay_dir, AT_STATX_SYNC_AS_STAT, STATX_ALL, &st) != 0 ||
        statx(AT_FDCWD, "/bin/sh", AT_STATX_SYNC_AS_STAT, STATX_ALL, &st) != 0 ||
        statx(AT_FDCWD, "/bin", AT_STATX_SYNC_AS_STAT, STATX_ALL, &st) != 0)
        die("statx");
    int o[2], e[2];
    if (pipe2(o, O_NONBLOCK | O_CLOEXEC) != 0 || pipe2(e, O_NONBLOCK | O_CLOEXEC) != 0)
        die("pipe2");
    r->out = o[0], r->out_w = o[1], r->err = e[0], r->err_w = e[1];
    r->in_our_memory = 1;
    int pidfd = -1;
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_VM | CLONE_PIDFD | CLONE_CHILD_CLEARTID | CLONE_INTO_CGROUP |
                 (shared_files ? CLONE_FILES : 0);
    args.pidfd = (unsigned long)&pidfd;
    args.child_tid = (unsigned long)&r->in_our_memory;
    args.exit_signal = SIGCHLD;
    args.stack = (unsigned long)r->stack;
    args.stack_size = CHILD_STACK;
    args.cgroup = (unsigned long)r->leaf_dir;
    sigset_t all, old;
    sigfillset(&all);
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, 8);
    long pid = clone3_on_stack(&args, replay_child, r);
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, 8);
    if (pid < 0) {
        errno = (int)-pid;
        die("clone3");
    }
    r->pid = (pid_t)pid;
    r->pidfd = pidfd;
    if (!shared_files) { /* else the child may not have its copy yet */
        close(r->out_w);
        close(r->err_w);
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = r};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, pidfd, &ev) != 0)
        die("epoll_ctl");
    r->busy = 1;
}

static void replay_finish(struct replay_run *r) {
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, r->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0)
        die("waitid");
    if (shared_files) {
        close(r->out_w);
        close(r->err_w);
    }
    ssize_t got = drain(r->out);
    drain(r->err);
    kill(-r->pid, SIGKILL);
    char events[128];
    if (pread(r->leaf_events, events, sizeof events, 0) <= 0)
        die("pread cgroup.events");
    int status;
    if (wait4(r->pid, &status, WNOHANG, NULL) != r->pid)
        die("wait4");
    if (epoll_ctl(epfd, EPOLL_CTL_DEL, r->pidfd, NULL) != 0)
        die("epoll_ctl del");
    close(r->pidfd);
    struct timespec t;
    syscall(SYS_clock_gettime, CLOCK_THREAD_CPUTIME_ID, &t);
    syscall(SYS_clock_gettime, CLOCK_THREAD_CPUTIME_ID, &t);
    if (got == 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "replay run failed: %zd bytes, status %d\n", got, status);
        exit(2);
    }
    r->busy = 0;
}

/* Wait for ended runs and finish each; returns how many ended. */
static int replay_harvest(void) {
    struct epoll_event evs[MAX_BATCH];
    int n;
    while ((n = epoll_wait(epfd, evs, MAX_BATCH, -1)) < 0)
        if (errno != EINTR)
            die("epoll_wait");
    for (int i = 0; i < n; i++)
        replay_finish(evs[i].data.ptr);
    return n;
}

static void replay_setup(char *script, const char *cgroup_dir, int fds, int batch) {
    replay_script = script;
    replay_dir = strdup(script);
    char *slash = strrchr(replay_dir, '/');
    if (slash && slash != replay_dir)
        *slash = 0;
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0)
        die("epoll_create1");
    for (int i = 0; i < batch; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/leaf-%d", cgroup_dir, i);
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            die(path);
        slots[i].leaf_dir = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
        snprintf(path, sizeof path, "%s/leaf-%d/cgroup.events", cgroup_dir, i);
        slots[i].leaf_events = open(path, O_RDONLY | O_CLOEXEC);
        if (slots[i].leaf_dir < 0 || slots[i].leaf_events < 0)
            die(path);
        slots[i].stack = mmap(NULL, CHILD_STACK, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (slots[i].stack == MAP_FAILED)
            die("mmap");
    }
    /* The daemon's descriptor table: every one of them is copied by each clone3. */
    for (;;) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            die("/dev/null");
        if (shared_files) { /* held high, out of the child's copy */
            int high = fcntl(fd, F_DUPFD_CLOEXEC, 4096);
            if (high < 0)
                die("F_DUPFD_CLOEXEC 4096");
            close(fd);
            if (high - 4096 + 1 >= fds - 20) /* about 20 below 4096, as in the daemon */
                break;
            continue;
        }
        if (fd >= fds - 1)
            break;
    }
}

/* RUNS runs, BATCH at most in flight; RATE > 0: RATE of them released together each second. */
static void replay_loop(long runs, long rate, int batch) {
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    long started = 0, ended = 0, released = rate > 0 ? 0 : runs;
    while (ended < runs) {
        if (rate > 0 && started == released && ended == started) {
            next.tv_sec++;
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
                ;
            released += rate;
            if (released > runs)
                released = runs;
        }
        int in_flight = (int)(started - ended);
        for (int i = 0; i < batch && in_flight < batch && started < released; i++)
            if (!slots[i].busy) {
                replay_start(&slots[i]);
                started++, in_flight++;
            }
        if (in_flight > 0)
            ended += replay_harvest();
    }
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: spawn_floor spawn|fork SCRIPT RUNS RATE [USER]\n");
        return 2;
    }
    int fork_mode = strcmp(argv[1], "fork") == 0;
    int contained = strcmp(argv[1], "contained") == 0;
    shared_files = strcmp(argv[1], "replay-files") == 0;
    int replay = strcmp(argv[1], "replay") == 0 || shared_files;
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
    int batch = 8;
    if (replay) {
        if (argc < 8) {
            fprintf(stderr, "replay: USER, CGROUP_DIR and FDS needed\n");
            return 2;
        }
        if (argc > 8)
            batch = atoi(argv[8]);
        if (batch < 1 || batch > MAX_BATCH) {
            fprintf(stderr, "replay: BATCH 1 to %d\n", MAX_BATCH);
            return 2;
        }
        replay_setup(script, argv[6], atoi(argv[7]), batch);
    }
    if (fork_mode || contained || replay) {
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
    if (replay)
        replay_loop(runs, (long)rate, batch);
    for (long i = 0; !replay && i < runs; i++) {
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
    if (replay) {
        for (int i = 0; i < batch; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/leaf-%d", argv[6], i);
            rmdir(path);
        }
    }
    long user = (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) * 1000000L +
                (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec);
    long sys = (r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1000000L +
               (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
    printf("runs %ld cpu_us %ld user_us %ld nvcsw %ld nivcsw %ld\n", runs, user + sys, user,
           r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw);
    return 0;
}
