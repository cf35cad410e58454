/*
 * rcluster.h — a Redis Cluster of N masters on loopback for the remote tier's suites and
 * benchmark.
 *
 * DESIGN
 * rcluster_up makes a temporary directory, picks N free loopback ports (and their cluster
 * bus ports, +10000), starts one `redis-server --cluster-enabled yes --bind 127.0.0.1` per
 * port in its own subdirectory (daemon_fork: each dies with the process that started it),
 * joins them with `redis-cli --cluster create ... --cluster-yes` and waits, bounded, for
 * cluster_state:ok on every node. rcluster_down kills them by pid and removes the
 * directory. No persistence (save "", appendonly no); maxmemory with allkeys-lru, the one
 * eviction authority, as docs/remote.md sets it up.
 */
#ifndef KVC_TESTS_RCLUSTER_H
#define KVC_TESTS_RCLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define RCLUSTER_MAX 8

struct rcluster {
    int n;
    char dir[256];
    int ports[RCLUSTER_MAX];
    pid_t pids[RCLUSTER_MAX]; /* 0: not running */
    char seeds[256];          /* "127.0.0.1:P1,127.0.0.1:P2,..." */
    /* Deployment secrets (remote.key_file) of 32 random bytes, mode 0600: key_file the one
     * the suites' daemons share, other_key_file another deployment's. */
    char key_file[300];
    char other_key_file[300];
};

/* Whether redis-server and redis-cli can be run here. */
bool rcluster_available(void);
/* Starts n masters and joins them. 0; 1 with a reason in why for a skip (no free ports, no
 * temporary directory); -1 with a reason for a failure. rcluster_down in every case. */
int rcluster_up(struct rcluster *rc, int n, const char *maxmemory, char *why, size_t whylen);
void rcluster_down(struct rcluster *rc);
/* Writes a secret file of 32 random bytes, mode 0600, at path. 0 or -errno. */
int rcluster_secret_write(const char *path);
/* Starts node i again (after a kill), in its own directory with its nodes.conf. */
int rcluster_node_start(struct rcluster *rc, int i);
void rcluster_node_kill(struct rcluster *rc, int i);
/* Waits up to ms (scaled by daemon_slow) for cluster_state:ok on every running node. */
bool rcluster_wait_ok(const struct rcluster *rc, int ms);

#endif
