/* Benchmark: single-thread BPE encoding throughput of nabla's tokenizer.
 * Usage: bench_tokenizer_encode TOKENIZER TEXTFILE [REPS]
 * Encodes the whole file REPS times (default 7) and prints the median MB/s,
 * the id count and a checksum of the ids (so a driver can check the ids
 * against another tokenizer's), as one JSON line. bench/tokenizer_vs_tiktoken.py
 * runs it side by side with tiktoken. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "nabla/nabla.h"

int main(int argc, char **argv) {
  if (argc < 3) return fprintf(stderr, "usage: %s TOKENIZER TEXTFILE [REPS]\n", argv[0]), 2;
  int reps = argc > 3 ? atoi(argv[3]) : 7;
  if (reps < 1 || reps > 100) reps = 7;
  FILE *f = fopen(argv[2], "rb");
  if (!f) return fprintf(stderr, "cannot open %s\n", argv[2]), 1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)n);
  if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) return fprintf(stderr, "read failed\n"), 1;
  fclose(f);
  nb_ctx *ctx = nb_ctx_create();
  nb_tok *t = nb_tok_load(ctx, argv[1]);
  if (!t) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
  double secs[100];
  nb_tok_ids ids = {0};
  for (int r = 0; r < reps; r++) {
    ids.len = 0;
    double t0 = now_s();
    if (nb_tok_encode(t, text, (size_t)n, NULL, &ids)) return fprintf(stderr, "%s\n", nb_ctx_error(ctx)), 1;
    secs[r] = now_s() - t0;
  }
  double med = median(secs, reps);
  unsigned long long sum = 0;
  for (size_t i = 0; i < ids.len; i++) sum = (sum * 1000003ull + (unsigned)ids.ids[i]) % 1000000007ull;
  printf("{\"bytes\": %ld, \"ids\": %zu, \"checksum\": %llu, \"median_s\": %.6f, \"mb_per_s\": %.2f}\n", n, ids.len, sum,
         med, (double)n / 1e6 / med);
  nb_tok_ids_free(t, &ids);
  nb_tok_destroy(t);
  nb_ctx_destroy(ctx);
  free(text);
  return 0;
}
