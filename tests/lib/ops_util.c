/*
 * ops_util.c — see ops_util.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/lib/daemon.h"
#include "tests/lib/ops_util.h"

static void ops_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int ops_daemon_start(struct ops_daemon *d, const char *const *args, const char *const *env)
{
    char *argv[64];
    char sockopt[160];
    int n = 0;
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/kvcd-ops.XXXXXX");
    if (!mkdtemp(d->dir))
        return -1;
    chmod(d->dir, 0755);
    snprintf(d->sock, sizeof(d->sock), "%s/kvcd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/kvcd.log", d->dir);
    snprintf(sockopt, sizeof(sockopt), "server.socket=%s", d->sock);
    argv[n++] = (char *)daemon_bin("kvcd");
    argv[n++] = (char *)"-o";
    argv[n++] = sockopt;
    argv[n++] = (char *)"-o";
    argv[n++] = (char *)"host.size=32m";
    argv[n++] = (char *)"-o";
    argv[n++] = (char *)"host.prefault=no";
    argv[n++] = (char *)"-o";
    argv[n++] = (char *)"host.hugepages=off";
    for (; args && *args && n < 62; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    d->pid = daemon_fork();
    if (d->pid < 0)
        return -1;
    if (d->pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            close(fd);
        }
        for (; env && *env; env++)
            putenv((char *)*env);
        execv(argv[0], argv);
        _exit(127);
    }
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(DAEMON_START_MS);
    while (daemon_now_ms() < end) {
        struct stat st;
        int status;
        if (stat(d->sock, &st) == 0 && S_ISSOCK(st.st_mode))
            return 0;
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            d->pid = 0;
            return -1;
        }
        ops_sleep_ms(10);
    }
    fprintf(stderr, "ops: kvcd did not bind %s in time (see %s)\n", d->sock, d->log);
    return -1;
}

int ops_daemon_stop(struct ops_daemon *d)
{
    if (d->pid > 0)
        kill(d->pid, SIGTERM);
    return ops_daemon_wait(d);
}

int ops_daemon_wait(struct ops_daemon *d)
{
    int status = -1;
    char cmd[128];
    if (d->pid > 0) {
        if (waitpid(d->pid, &status, 0) == d->pid)
            status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        d->pid = 0;
    }
    if (d->dir[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
        if (system(cmd) != 0)
            status = -1;
    }
    return status;
}

int ops_kvcctl(const struct ops_daemon *d, char *out, size_t len, const char *const *args)
{
    char *argv[32];
    int pfd[2], n = 0, status;
    size_t got = 0;
    pid_t pid;
    argv[n++] = (char *)daemon_bin("kvcctl");
    argv[n++] = (char *)"-s";
    argv[n++] = (char *)d->sock;
    for (; *args && n < 31; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    if (pipe(pfd))
        return -1;
    pid = daemon_fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(pfd[1]);
    for (;;) {
        ssize_t r = read(pfd[0], out + got, len - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
        if (got == len - 1) {
            char sink[4096];
            while (read(pfd[0], sink, sizeof(sink)) > 0)
                ;
            break;
        }
    }
    out[got] = 0;
    close(pfd[0]);
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int ops_write_file(const struct ops_daemon *d, const char *name, const char *text, char *path,
                   size_t len)
{
    FILE *f;
    snprintf(path, len, "%s/%s", d->dir[0] ? d->dir : "/tmp", name);
    f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f) ? -1 : 0;
}
