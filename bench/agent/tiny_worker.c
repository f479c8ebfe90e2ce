/* tiny-worker: the smallest worker the agent's benchmark starts, to show the launcher's own cost.
 *
 * Prints "running <attempt> <rank> <CLOCK_MONOTONIC ns>" (attempt = TORCHELASTIC_RESTART_COUNT,
 * rank = RANK), then, by TINY_WORKER_DO: "hang" waits for a signal, "fail0" exits 1 as rank 0 of
 * attempt 0 and hangs otherwise, anything else (or nothing) exits 0. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const char* rank = getenv("RANK");
    const char* attempt = getenv("TORCHELASTIC_RESTART_COUNT");
    const char* what = getenv("TINY_WORKER_DO");
    if (rank == NULL) rank = "0";
    if (attempt == NULL) attempt = "0";
    if (what == NULL) what = "";
    char line[128];
    const int n = snprintf(line, sizeof line, "running %s %s %lld\n", attempt, rank,
                           (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    if (n <= 0 || write(1, line, (size_t)n) != n) return 2;
    if (strcmp(what, "fail0") == 0 && strcmp(rank, "0") == 0 && strcmp(attempt, "0") == 0) return 1;
    if (strcmp(what, "hang") == 0 || strcmp(what, "fail0") == 0) {
        for (;;) pause();
    }
    return 0;
}
