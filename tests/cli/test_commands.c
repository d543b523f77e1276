/* The `nabla` command as a whole: --help of every command and subcommand
 * (found from the usage texts) goes to stdout with exit 0; --version names
 * the build; an output that is or lies inside an input is refused; bad
 * numbers, directories and multi-document configs are errors, not defaults;
 * generate refuses weights its config does not describe. */
#include <sys/stat.h>
#include <unistd.h>

#include "testfs.h"

static const char *bin;
static char prefix[4200]; /* the binary, with a fixed peak so that no test measures one */
static char out[1 << 16], err[1 << 16], work[4096];

/* runs "nabla ARGS" (printf-formatted) in work; stdout in out, stderr in err */
#define nabla(...) nb_test_run_in(work, prefix, out, sizeof out, err, sizeof err, __VA_ARGS__)

static void check_help(const char *what) {
  int rc = nabla("%s --help", what);
  char want[256];
  snprintf(want, sizeof want, "usage: nabla %s", what);
  /* a subcommand's help is its command's usage, which names the subcommand */
  CHECK_MSG(rc == 0 && !err[0] && strstr(out, "usage: nabla") && (strstr(out, want) || strchr(what, ' ')),
            "nabla %s --help: rc %d, stdout '%.200s', stderr '%.200s'", what, rc, out, err);
}

/* every command of `nabla --help`, and every "nabla CMD SUB" its usage names */
static void test_help(void) {
  CHECK_MSG(nabla("--help") == 0 && strstr(out, "commands:") && !err[0], "%s%s", out, err);
  static char top[1 << 16];
  snprintf(top, sizeof top, "%s", out);
  int n_cmds = 0, n_subs = 0;
  for (char *line = strtok(top, "\n"); line; line = strtok(NULL, "\n")) {
    char name[64], sub[64];
    if (line[0] != ' ' || line[1] != ' ' || line[2] == ' ' || sscanf(line, "%63s", name) != 1) continue;
    check_help(name);
    n_cmds++;
    static char usage[1 << 16];
    snprintf(usage, sizeof usage, "%s", out);
    char pat[96];
    snprintf(pat, sizeof pat, "nabla %s ", name);
    for (char *p = strstr(usage, pat); p; p = strstr(p + 1, pat)) {
      if (sscanf(p + strlen(pat), "%63[a-z]", sub) != 1) continue;
      char both[160];
      snprintf(both, sizeof both, "%s %s", name, sub);
      check_help(both);
      n_subs++;
    }
  }
  printf("--help: %d commands, %d subcommand usages\n", n_cmds, n_subs);
  CHECK_MSG(n_cmds >= 8 && n_subs >= 10, "%d commands, %d subcommands", n_cmds, n_subs);
  CHECK(nabla("%s", "") == 2 && strstr(err, "usage: nabla"));
  CHECK(nabla("frobnicate") == 2 && strstr(err, "unknown command"));
  CHECK_MSG(nabla("generate --prompt") == 2 && strstr(err, "--prompt needs a value"), "%s", err);
}

static void test_version(void) {
  for (int i = 0; i < 2; i++) {
    int rc = nabla(i ? "version" : "--version");
    CHECK_MSG(rc == 0 && strstr(out, "nabla " NB_VERSION_STRING "\n") && strstr(out, "\ncommit ") &&
                  strstr(out, "\ncompiler ") && strstr(out, "\nblas ") && strstr(out, "\nisa "),
              "rc %d: %s%s", rc, out, err);
  }
}

/* data build, ckpt export/import and tok train never write over an input */
static void test_output_is_input(void) {
  nb_test_write_text("notes.txt", "a note to keep\nanother line\n");
  CHECK(mkdir("dir", 0755) == 0);
  nb_test_write_text("dir/a.txt", "some text in a directory\n");
  CHECK(symlink("notes.txt", "link.txt") == 0);
  CHECK(link("notes.txt", "hard.txt") == 0);
  const char *same[] = {"-o notes.txt notes.txt", "-o ./dir/../notes.txt notes.txt", "-o link.txt notes.txt",
                        "-o hard.txt notes.txt", "-o dir/out.rec dir", "-o dir/new/out.tok dir/"};
  for (int i = 0; i < 6; i++) {
    int rc = nabla("data build %s", same[i]);
    CHECK_MSG(rc == 2 && strstr(err, "refusing to overwrite an input"), "data build %s: rc %d: %s", same[i], rc, err);
  }
  char *kept = nb_test_read_file("notes.txt", NULL);
  CHECK_MSG(kept && !strcmp(kept, "a note to keep\nanother line\n"), "notes.txt is now '%s'", kept ? kept : "(gone)");
  free(kept);
  CHECK_MSG(nabla("data build -o notes.rec notes.txt") == 0 && strstr(out, "2 records"), "%s%s", out, err);
  nb_test_write_text("dir/tokenizer.json", "text to train a tokenizer on, not a tokenizer\n");
  int rc = nabla("tok train --vocab-size 300 --out dir dir/tokenizer.json");
  CHECK_MSG(rc == 2 && strstr(err, "refusing to overwrite an input"), "rc %d: %s", rc, err);
  unlink("dir/tokenizer.json");

  /* a checkpoint: import a safetensors file as step 1, then export into it */
  CHECK_MSG(nabla("ckpt import %s/tests/ckpt/golden/all_dtypes.safetensors ck --step 1",
                  getenv("NABLA_SOURCE_DIR") ? getenv("NABLA_SOURCE_DIR") : ".") == 0,
            "%s%s", out, err);
  rc = nabla("ckpt export ck 1 ck/1/params.safetensors");
  CHECK_MSG(rc == 2 && strstr(err, "is inside the input ck"), "rc %d: %s", rc, err);
  rc = nabla("ckpt export ck 1 ck --shard-size 1000");
  CHECK_MSG(rc == 2 && strstr(err, "refusing to overwrite an input"), "rc %d: %s", rc, err);
  CHECK_MSG(nabla("ckpt verify ck all") == 0, "%s%s", out, err);
  CHECK_MSG(nabla("ckpt export ck 1 model.safetensors") == 0, "%s%s", out, err);
  rc = nabla("ckpt import ck/step_00000001 ck --step 2");
  CHECK_MSG(rc == 2 && strstr(err, "inside the output directory"), "rc %d: %s", rc, err);
}

/* numbers are strict; directories and second YAML documents are errors */
static void test_bad_values(void) {
  struct { const char *args, *want; } cases[] = {
      {"generate --run-dir r --prompt hi --max-tokens 2.5", "--max-tokens: '2.5' is not an integer"},
      {"generate --run-dir r --prompt hi --threads abc", "--threads: 'abc' is not an integer"},
      {"generate --run-dir r --prompt hi --top-p 1.5", "--top-p: 1.5 is out of range"},
      {"train --threads abc", "--threads: 'abc' is not an integer"},
      {"train --threads 4x", "'4x' is not an integer"},
      {"train --peak-gflops fast", "--peak-gflops: 'fast' is not a finite number"},
      {"ckpt import model.safetensors ck --step 99999999999999999999", "--step: 99999999999999999999 is out of range"},
      {"ckpt verify ck 99999999999999999999", "step: 99999999999999999999 is out of range"},
      {"ckpt show ck 1.5", "step: '1.5' is not an integer"},
      {"ckpt export ck 1 x.safetensors --shard-size 10k", "'10k' is not an integer"},
      {"tok train --vocab-size 1e3 --out t notes.txt", "--vocab-size: '1e3' is not an integer"},
      {"data build -o x.rec --zstd 2.5 notes.txt", "--zstd: '2.5' is not an integer"},
      {"data build -o x.tok --token-bytes 3 notes.txt", "--token-bytes is 2 or 4"},
      {"model config - steps=2.5", "steps: '2.5' is not an integer"},
      {"model config - optim.lr=fast", "optim.lr: 'fast' is not a finite number"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = nabla("%s", cases[i].args);
    CHECK_MSG(rc != 0 && strstr(err, cases[i].want), "nabla %s: rc %d: %s", cases[i].args, rc, err);
  }
  /* a directory is not an empty input */
  int rc = nabla("tok train --vocab-size 300 --out t dir");
  CHECK_MSG(rc == 1 && strstr(err, "dir is a directory"), "rc %d: %s", rc, err);
  CHECK(nabla("tok train --vocab-size 300 --out t notes.txt") == 0);
  rc = nabla("tok encode t dir");
  CHECK_MSG(rc == 1 && strstr(err, "dir is a directory"), "rc %d: %s", rc, err);
  /* ids are not cut to 32 bits: 2^32 + 104 is not 'h' */
  nb_test_write_text("ids.txt", "4294967400 105\n");
  rc = nabla("tok decode t ids.txt");
  CHECK_MSG(rc == 1 && strstr(err, "4294967400 is out of range"), "rc %d: '%s' %s", rc, out, err);
  nb_test_write_text("ids.txt", "104 105\n");
  CHECK_MSG(nabla("tok decode t ids.txt") == 0 && !strcmp(out, "hi"), "'%s' %s", out, err);
  /* a parameter count past 64 bits is an error, not a negative total */
  rc = nabla("model params - model.n_layers=64 model.d_model=200000000 model.n_heads=1 model.n_kv_heads=1 "
             "model.d_ff=200000000");
  CHECK_MSG(rc == 1 && !strstr(out, "total -") && strstr(err, "does not fit in 64 bits"), "rc %d: %.200s %s", rc, out, err);
  rc = nabla("model params - model.vocab_size=1000000000000 model.d_model=10000000");
  CHECK_MSG(rc == 1 && strstr(err, "too large"), "rc %d: %s", rc, err);
  /* a second YAML document is not silently ignored */
  nb_test_write_text("two.yaml", "steps: 5\n---\nsteps: 7\n");
  rc = nabla("model config two.yaml");
  CHECK_MSG(rc == 1 && strstr(err, "two.yaml:2: a second YAML document"), "rc %d: %s", rc, err);
  nb_test_write_text("one.yaml", "---\nsteps: 5\n...\n");
  CHECK_MSG(nabla("model config one.yaml") == 0 && strstr(out, "steps: 5"), "%s", err);
}

/* generate with a config that describes another model than the weights */
static void test_generate_mismatch(void) {
  FILE *f = fopen("corpus.txt", "w");
  for (int i = 0; f && i < 300; i++) fprintf(f, "line %d of a small corpus for the command test\n", i);
  if (f) fclose(f);
  const char *tiny = "data.train=corpus.txt model.preset=gpt2-tiny model.d_model=32 model.n_heads=2 model.n_kv_heads=2 "
                     "model.d_ff=64 model.max_seq_len=16 data.seq_len=16 batch_size=2 steps=1 eval_every=0 log_every=1 "
                     "checkpoint_every=0 --threads 1";
  int rc = nabla("train --run-dir run %s model.n_layers=2", tiny);
  CHECK_MSG(rc == 0 && strstr(out, "done: step 1") && strstr(out, "(env NABLA_PEAK_GFLOPS)"), "rc %d: %s%s", rc, out, err);
  CHECK_MSG(nabla("generate --run-dir run --prompt line --max-tokens 4 --temperature 0") == 0, "%s", err);
  /* environment numbers are as strict as flags */
  setenv("NABLA_THREADS", "4x", 1);
  rc = nabla("generate --run-dir run --prompt line --max-tokens 1");
  unsetenv("NABLA_THREADS");
  CHECK_MSG(rc == 1 && strstr(err, "$NABLA_THREADS: '4x' is not an integer"), "rc %d: %s", rc, err);
  /* one layer fewer, another width: refused by the config stored in the
   * checkpoint, naming the key (without a stored config, by the weights'
   * shapes: tests/models/test_generate.c) */
  nb_test_write_text("less.yaml", "model:\n  preset: gpt2-tiny\n  n_layers: 1\n  d_model: 32\n  n_heads: 2\n  n_kv_heads: 2\n"
                                  "  d_ff: 64\n  max_seq_len: 16\ndata:\n  seq_len: 16\n");
  rc = nabla("generate --run-dir run --config less.yaml --prompt line --max-tokens 4");
  CHECK_MSG(rc == 1 && strstr(err, "less.yaml describes another model") && strstr(err, "model.n_layers differ"), "rc %d: %s", rc,
            err);
  nb_test_write_text("wide.yaml", "model:\n  preset: gpt2-tiny\n  n_layers: 2\n  d_model: 64\n  n_heads: 2\n  n_kv_heads: 2\n"
                                  "  d_ff: 64\n  max_seq_len: 16\ndata:\n  seq_len: 16\n");
  rc = nabla("generate --run-dir run --config wide.yaml --prompt line --max-tokens 4");
  CHECK_MSG(rc == 1 && strstr(err, "wide.yaml describes another model") && strstr(err, "model.d_model differ"), "rc %d: %s", rc,
            err);
}

int main(void) {
  bin = nb_test_nabla_bin();
  if (!bin) return nb_test_summary("cli/commands");
  snprintf(prefix, sizeof prefix, "NABLA_PEAK_GFLOPS=10 %s", bin);
  nb_test_scratch_dir(work, sizeof work, "cli", "commands");
  char here[4096];
  if (!getcwd(here, sizeof here) || chdir(work) != 0) return fprintf(stderr, "cannot enter %s\n", work), 1;
  test_help();
  test_version();
  test_output_is_input();
  test_bad_values();
  test_generate_mismatch();
  if (chdir(here) != 0) return 1;
  if (!nb_test_failures) nb_test_rm_rf(work);
  return nb_test_summary("cli/commands");
}
