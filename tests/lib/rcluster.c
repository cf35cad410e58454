/*
 * rcluster.c — a Redis Cluster on loopback for tests (rcluster.h).
 */
#include "tests/lib/rcluster.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/lib/daemon.h"

static void rcluster_sleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool rcluster_port_free(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

bool rcluster_available(void)
{
    const char *a[] = {"/usr/bin/env", "redis-server", "--version", NULL};
    const char *b[] = {"/usr/bin/env", "redis-cli", "--version", NULL};
    return daemon_run(a, NULL, 0, NULL, 0, 10000) == 0 &&
           daemon_run(b, NULL, 0, NULL, 0, 10000) == 0;
}

static const char *rcluster_maxmemory = "256mb";

int rcluster_node_start(struct rcluster *rc, int i)
{
    char dir[300], port[16];
    snprintf(dir, sizeof(dir), "%s/%d", rc->dir, rc->ports[i]);
    mkdir(dir, 0700);
    snprintf(port, sizeof(port), "%d", rc->ports[i]);
    pid_t pid = daemon_fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        if (chdir(dir) != 0 || !freopen("redis.log", "a", stdout))
            _exit(127);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
               "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
               "--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no",
               "--protected-mode", "yes", "--maxmemory", rcluster_maxmemory, "--maxmemory-policy",
               "allkeys-lru", (char *)NULL);
        _exit(127);
    }
    rc->pids[i] = pid;
    /* Up when it answers. */
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(10000);
    while (daemon_now_ms() < end) {
        struct timeval tv = {1, 0};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", rc->ports[i], tv);
        bool ok = c && !c->err;
        if (c)
            redisFree(c);
        if (ok)
            return 0;
        rcluster_sleep(30);
    }
    return -ETIMEDOUT;
}

void rcluster_node_kill(struct rcluster *rc, int i)
{
    if (rc->pids[i] > 0) {
        kill(rc->pids[i], SIGKILL);
        waitpid(rc->pids[i], NULL, 0);
    }
    rc->pids[i] = 0;
}

static bool rcluster_node_ok(int port)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r = NULL;
    bool ok = false;
    if (c && !c->err) {
        redisSetTimeout(c, tv);
        r = redisCommand(c, "CLUSTER INFO");
        ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
    }
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return ok;
}

bool rcluster_wait_ok(const struct rcluster *rc, int ms)
{
    uint64_t end = daemon_now_ms() + (uint64_t)daemon_ms(ms);
    while (daemon_now_ms() < end) {
        bool ok = true;
        for (int i = 0; i < rc->n; i++)
            ok = ok && (rc->pids[i] <= 0 || rcluster_node_ok(rc->ports[i]));
        if (ok)
            return true;
        rcluster_sleep(100);
    }
    return false;
}

int rcluster_secret_write(const char *path)
{
    uint8_t key[32];
    int fd, rc = 0;
    fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, key, sizeof(key)) != (ssize_t)sizeof(key))
        rc = -EIO;
    if (fd >= 0)
        close(fd);
    if (rc)
        return rc;
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if (write(fd, key, sizeof(key)) != (ssize_t)sizeof(key))
        rc = -EIO;
    close(fd);
    return rc;
}

int rcluster_up(struct rcluster *rc, int n, const char *maxmemory, char *why, size_t whylen)
{
    char out[4096], addr[RCLUSTER_MAX][32];
    const char *argv[RCLUSTER_MAX + 8];
    int na = 0, base = 0;
    memset(rc, 0, sizeof(*rc));
    if (n < 3 || n > RCLUSTER_MAX) {
        snprintf(why, whylen, "a cluster needs 3 to %d masters", RCLUSTER_MAX);
        return -1;
    }
    if (maxmemory)
        rcluster_maxmemory = maxmemory;
    rc->n = n;
    snprintf(rc->dir, sizeof(rc->dir), "/tmp/kvcd-rcluster.XXXXXX");
    if (!mkdtemp(rc->dir)) {
        snprintf(why, whylen, "mkdtemp: %s", strerror(errno));
        rc->dir[0] = '\0';
        return 1;
    }
    snprintf(rc->key_file, sizeof(rc->key_file), "%s/deployment.key", rc->dir);
    snprintf(rc->other_key_file, sizeof(rc->other_key_file), "%s/other.key", rc->dir);
    if (rcluster_secret_write(rc->key_file) || rcluster_secret_write(rc->other_key_file)) {
        snprintf(why, whylen, "cannot write the secret files in %s", rc->dir);
        return -1;
    }
    srand((unsigned)getpid() ^ (unsigned)daemon_now_ms());
    for (int tries = 0; tries < 100 && !base; tries++) {
        int b = 21000 + (rand() % 1400) * 10;
        bool ok = true;
        for (int i = 0; i < n; i++)
            ok = ok && rcluster_port_free(b + i) && rcluster_port_free(b + i + 10000);
        if (ok)
            base = b;
    }
    if (!base) {
        snprintf(why, whylen, "no free loopback ports");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        rc->ports[i] = base + i;
        if (rcluster_node_start(rc, i)) {
            snprintf(why, whylen, "redis-server on port %d did not start", rc->ports[i]);
            return -1;
        }
    }
    argv[na++] = "/usr/bin/env";
    argv[na++] = "redis-cli";
    argv[na++] = "--cluster";
    argv[na++] = "create";
    for (int i = 0; i < n; i++) {
        snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d", rc->ports[i]);
        argv[na++] = addr[i];
    }
    argv[na++] = "--cluster-yes";
    argv[na] = NULL;
    if (daemon_run(argv, out, sizeof(out), NULL, 0, daemon_ms(30000)) != 0 ||
        !rcluster_wait_ok(rc, 20000)) {
        snprintf(why, whylen, "redis-cli --cluster create failed");
        return -1;
    }
    snprintf(rc->seeds, sizeof(rc->seeds), "127.0.0.1:%d,127.0.0.1:%d", rc->ports[0], rc->ports[1]);
    return 0;
}

void rcluster_down(struct rcluster *rc)
{
    char cmd[400];
    for (int i = 0; i < rc->n; i++)
        rcluster_node_kill(rc, i);
    if (rc->dir[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rc->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "rcluster: cannot remove %s\n", rc->dir);
        rc->dir[0] = '\0';
    }
}
