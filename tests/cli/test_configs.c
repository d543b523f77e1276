/* Every shipped config (every YAML file in configs/) validates, has the parameter count
 * its model is known by, and, when it fits this machine, trains as shipped
 * on the default corpus for a few steps, with only the step count, batch
 * and sequence length overridden. The 7B+ models cannot train here (16
 * bytes a parameter); their headers say what they need. */
#include <dirent.h>
#include <unistd.h>

#include "testfs.h"

typedef struct shipped {
  const char *name;
  const char *params; /* "total N parameters" */
  const char *run;    /* the overrides of the short run; NULL: too big to train here */
} shipped;

static const shipped configs[] = {
    {"gpt2_tiny", "total 842496 parameters", "steps=2 batch_size=2 data.seq_len=32"},
    {"llama_tiny", "total 853120 parameters", "steps=2 batch_size=2 data.seq_len=32"},
    {"mixtral_tiny", "total 3413120 parameters", "steps=2 batch_size=2 data.seq_len=32"},
    {"deepseek_tiny", "total 1809536 parameters", "steps=2 batch_size=2 data.seq_len=32"},
    {"gpt2_124m", "total 124439808 parameters", "steps=1 batch_size=1 grad_accum=1 data.seq_len=16"},
    {"llama2_7b", "total 6738415616 parameters", NULL},
    {"llama3_8b", "total 8030261248 parameters", NULL},
    {"mixtral_8x7b", "total 46702792704 parameters", NULL},
};
enum { N_CONFIGS = sizeof configs / sizeof configs[0] };

static const shipped *find(const char *file) {
  for (int i = 0; i < N_CONFIGS; i++) {
    size_t n = strlen(configs[i].name);
    if (!strncmp(file, configs[i].name, n) && !strcmp(file + n, ".yaml")) return &configs[i];
  }
  return NULL;
}

int main(void) {
  const char *bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("cli/configs");
  static char out[1 << 16];
  char cmd[8192], work[4096];
  nb_test_scratch_dir(work, sizeof work, "cli", "configs");
  bool corpus = access("data/corpus/kjv.txt", R_OK) == 0, sanitized = getenv("NABLA_SANITIZED") != NULL;
  if (!corpus) printf("SKIPPED: the training runs: data/corpus/kjv.txt is missing (scripts/corpus.sh installs it)\n");
  DIR *d = opendir("configs");
  CHECK_MSG(d != NULL, "no configs/ directory (run from the source tree)");
  int seen = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    const shipped *c = find(e->d_name);
    CHECK_MSG(c != NULL, "configs/%s is not in this test's table: add its parameter count and run", e->d_name);
    if (!c) continue;
    seen++;
    snprintf(cmd, sizeof cmd, "%s model params configs/%s.yaml 2>&1", bin, c->name);
    CHECK_MSG(nb_test_run(cmd, out, sizeof out) == 0 && strstr(out, c->params), "%s: %s", c->name, out);
    if (!c->run || !corpus) continue;
    if (sanitized && strstr(c->params, "124439808")) {
      printf("SKIPPED: %s's training run under sanitizers (about a minute without them)\n", c->name);
      continue;
    }
    snprintf(cmd, sizeof cmd, "NABLA_PEAK_GFLOPS=10 %s train configs/%s.yaml --run-dir %s/%s %s 2>&1", bin, c->name, work,
             c->name, c->run);
    int rc = nb_test_run(cmd, out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "done: step"), "%s: rc %d: %s", c->name, rc, out);
    printf("%s: trained as shipped (%s)\n", c->name, c->run);
  }
  if (d) closedir(d);
  CHECK_MSG(seen == N_CONFIGS, "%d of the %d configs of the table are in configs/", seen, N_CONFIGS);
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("cli/configs");
}
