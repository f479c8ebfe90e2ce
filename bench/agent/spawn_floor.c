/* spawn-floor: the floor under any launcher. Starts N copies of PROGRAM at once, each with
 * RANK=<i> and TORCHELASTIC_RESTART_COUNT=0 added to this environment, by vfork and execve (what
 * the fastest launcher does, with nothing else: no store, no cgroup, no supervision), then waits
 * for them all. Exits 0 when every one exited 0.
 *
 *   spawn-floor N PROGRAM */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

int main(int argc, char** argv) {
    if (argc != 3 || atoi(argv[1]) <= 0) {
        fprintf(stderr, "usage: spawn-floor N PROGRAM\n");
        return 2;
    }
    const int n = atoi(argv[1]);
    size_t count = 0;
    while (environ[count] != NULL) ++count;
    char** env = calloc(count + 3, sizeof *env);
    if (env == NULL) return 2;
    memcpy(env, environ, count * sizeof *env);
    env[count + 1] = "TORCHELASTIC_RESTART_COUNT=0";
    char* args[] = {argv[2], NULL};
    static char rank[32];
    for (int i = 0; i < n; ++i) {
        snprintf(rank, sizeof rank, "RANK=%d", i);
        env[count] = rank;  /* read by the child before this loop writes it again: vfork */
        const pid_t pid = vfork();
        if (pid == 0) {
            execve(argv[2], args, env);
            _exit(127);
        }
        if (pid < 0) {
            perror("vfork");
            return 2;
        }
    }
    int failed = 0;
    int status = 0;
    while (wait(&status) > 0) {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
    }
    return failed;
}
