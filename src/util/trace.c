/* The trace recorder of src/util/trace.h. Each thread that records gets a
 * buffer, registered once in a global list and kept for the life of the
 * process (a thread that exits leaves its events behind; its buffer is
 * reused by a later thread once those have been cleared). The owning thread
 * appends under the buffer's mutex, which only the collector ever contends
 * for, so a span recorded while nb_util__trace_disable runs is either in the
 * trace or not, never half-written. Not here: the file formats (src/prof/). */
#include "util/trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

atomic_int nb_util__trace_flag;

#define STACK_DEPTH 32

typedef struct open_span {
  int64_t t0;
  const char *cat;
  char name[NB_UTIL_TRACE_NAME];
} open_span;

typedef struct tbuf {
  struct tbuf *next; /* the registry's list */
  pthread_mutex_t mu;
  int tid;
  bool exited;       /* its thread is gone: reusable once it holds no events */
  char name[32];
  nb_util__trace_event *ev;
  size_t n, cap;
  open_span stack[STACK_DEPTH];
  int depth;         /* may exceed STACK_DEPTH: those levels are not recorded */
  uint64_t session;  /* the session its stack belongs to */
} tbuf;

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static tbuf *registry;
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static _Thread_local tbuf *mine;

/* under registry_mu while enabled; read by recording threads without it:
 * a racy read only misplaces one event at a session's edge */
static atomic_llong room = 0, dropped = 0;
static atomic_ullong session = 0;

static void on_thread_exit(void *p) {
  tbuf *b = p;
  pthread_mutex_lock(&b->mu);
  b->exited = true;
  pthread_mutex_unlock(&b->mu);
}

static void make_key(void) { pthread_key_create(&exit_key, on_thread_exit); }

static tbuf *my_buffer(void) {
  if (mine) return mine;
  pthread_once(&key_once, make_key);
  tbuf *b = NULL;
  pthread_mutex_lock(&registry_mu);
  for (tbuf *r = registry; r && !b; r = r->next) {
    pthread_mutex_lock(&r->mu);
    if (r->exited && r->n == 0) {
      b = r;
      b->exited = false;
      b->depth = 0;
    }
    pthread_mutex_unlock(&r->mu);
  }
  if (!b && (b = calloc(1, sizeof *b))) {
    pthread_mutex_init(&b->mu, NULL);
    b->next = registry;
    registry = b;
  }
  pthread_mutex_unlock(&registry_mu);
  if (!b) return NULL;
  b->tid = (int)syscall(SYS_gettid);
  if (pthread_getname_np(pthread_self(), b->name, sizeof b->name) != 0) snprintf(b->name, sizeof b->name, "thread %d", b->tid);
  pthread_setspecific(exit_key, b);
  return mine = b;
}

static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = src ? strlen(src) : 0;
  if (n >= cap) n = cap - 1;
  memcpy(dst, src ? src : "", n);
  dst[n] = 0;
}

/* b->mu held */
static void append(tbuf *b, const char *cat, const char *name, int64_t t0, int64_t t1, const nb_util__trace_arg *args,
                   int nargs, int64_t ref) {
  if (atomic_fetch_sub_explicit(&room, 1, memory_order_relaxed) <= 0) {
    atomic_fetch_add_explicit(&room, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
    return;
  }
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 256;
    nb_util__trace_event *ev = realloc(b->ev, cap * sizeof *ev);
    if (!ev) {
      atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
      return;
    }
    b->ev = ev;
    b->cap = cap;
  }
  nb_util__trace_event *e = &b->ev[b->n++];
  e->counter = false;
  e->t0 = t0;
  e->dur = t1 > t0 ? t1 - t0 : 0;
  e->ref = ref;
  e->cat = cat ? cat : "";
  copy_str(e->name, sizeof e->name, name);
  e->nargs = nargs < 0 ? 0 : nargs > NB_UTIL_TRACE_ARGS ? NB_UTIL_TRACE_ARGS : nargs;
  for (int i = 0; i < e->nargs; i++) {
    e->args[i].key = args[i].key;
    e->args[i].is_str = args[i].str != NULL;
    e->args[i].num = args[i].num;
    if (args[i].str) copy_str(e->args[i].str, sizeof e->args[i].str, args[i].str);
  }
}

void nb_util__trace_span_ref(const char *cat, const char *name, int64_t t0, int64_t t1, const nb_util__trace_arg *args,
                             int nargs, int64_t ref) {
  if (!t0 || !nb_util__tracing()) return;
  tbuf *b = my_buffer();
  if (!b) return;
  pthread_mutex_lock(&b->mu);
  append(b, cat, name, t0, t1, args, nargs, ref);
  pthread_mutex_unlock(&b->mu);
}

void nb_util__trace_span(const char *cat, const char *name, int64_t t0, int64_t t1, const nb_util__trace_arg *args,
                         int nargs) {
  nb_util__trace_span_ref(cat, name, t0, t1, args, nargs, 0);
}

void nb_util__trace_counter(const char *cat, const char *name, int64_t t, const nb_util__trace_arg *args, int nargs) {
  if (!t || !nb_util__tracing()) return;
  tbuf *b = my_buffer();
  if (!b) return;
  pthread_mutex_lock(&b->mu);
  size_t n = b->n;
  append(b, cat, name, t, t, args, nargs, 0);
  if (b->n > n) b->ev[n].counter = true;
  pthread_mutex_unlock(&b->mu);
}

void nb_util__trace_begin(const char *cat, const char *name) {
  if (!nb_util__tracing()) return;
  tbuf *b = my_buffer();
  if (!b) return;
  int64_t t0 = nb_util__now_ns();
  pthread_mutex_lock(&b->mu);
  uint64_t s = atomic_load(&session);
  if (b->session != s) b->session = s, b->depth = 0; /* scopes left open by an earlier session */
  if (b->depth < STACK_DEPTH) {
    open_span *o = &b->stack[b->depth];
    o->t0 = t0;
    o->cat = cat;
    copy_str(o->name, sizeof o->name, name);
  }
  b->depth++;
  pthread_mutex_unlock(&b->mu);
}

void nb_util__trace_end(void) {
  tbuf *b = mine;
  if (!b) return; /* this thread never began a scope */
  int64_t t1 = nb_util__now_ns();
  pthread_mutex_lock(&b->mu);
  if (b->session == atomic_load(&session) && b->depth > 0) {
    b->depth--;
    if (b->depth < STACK_DEPTH && nb_util__tracing()) {
      const open_span *o = &b->stack[b->depth];
      append(b, o->cat, o->name, o->t0, t1, NULL, 0, 0);
    }
  }
  pthread_mutex_unlock(&b->mu);
}

void nb_util__trace_thread_name(const char *name) {
  char os[16];
  copy_str(os, sizeof os, name);
  pthread_setname_np(pthread_self(), os);
  tbuf *b = my_buffer();
  if (!b) return;
  pthread_mutex_lock(&b->mu);
  copy_str(b->name, sizeof b->name, name);
  pthread_mutex_unlock(&b->mu);
}

/* ---- notes ------------------------------------------------------------------ */

typedef struct note {
  struct note *next;
  int64_t key;
  char text[];
} note;

static pthread_mutex_t notes_mu = PTHREAD_MUTEX_INITIALIZER;
static note *notes, **notes_tail = &notes; /* in the order they were made */

uint64_t nb_util__trace_session(void) { return atomic_load(&session); }

void nb_util__trace_note(int64_t key, const char *text) {
  if (!nb_util__tracing() || !text) return;
  pthread_mutex_lock(&notes_mu);
  bool have = false;
  for (note *n = notes; n && !have; n = n->next) have = n->key == key;
  size_t len = strlen(text);
  note *n = have ? NULL : malloc(sizeof *n + len + 1);
  if (n) {
    n->next = NULL;
    n->key = key;
    memcpy(n->text, text, len + 1);
    *notes_tail = n;
    notes_tail = &n->next;
  }
  pthread_mutex_unlock(&notes_mu);
}

void nb_util__trace_notes(void (*fn)(void *ud, int64_t key, const char *text), void *ud) {
  pthread_mutex_lock(&notes_mu);
  for (note *n = notes; n; n = n->next) fn(ud, n->key, n->text);
  pthread_mutex_unlock(&notes_mu);
}

static void clear_notes(void) {
  pthread_mutex_lock(&notes_mu);
  while (notes) {
    note *n = notes;
    notes = n->next;
    free(n);
  }
  notes_tail = &notes;
  pthread_mutex_unlock(&notes_mu);
}

/* ---- the session ----------------------------------------------------------- */

static void clear_locked(void) {
  clear_notes();
  for (tbuf *b = registry; b; b = b->next) {
    pthread_mutex_lock(&b->mu);
    free(b->ev);
    b->ev = NULL;
    b->n = b->cap = 0;
    pthread_mutex_unlock(&b->mu);
  }
}

int64_t nb_util__trace_enable(int64_t max_events) {
  pthread_mutex_lock(&registry_mu);
  atomic_store(&nb_util__trace_flag, 0);
  clear_locked();
  atomic_store(&room, max_events > 0 ? max_events : (int64_t)1 << 20);
  atomic_store(&dropped, 0);
  atomic_fetch_add(&session, 1);
  int64_t t = nb_util__now_ns();
  atomic_store(&nb_util__trace_flag, 1);
  pthread_mutex_unlock(&registry_mu);
  return t;
}

void nb_util__trace_disable(void) { atomic_store(&nb_util__trace_flag, 0); }

int64_t nb_util__trace_collect(void (*fn)(void *, int, const char *, const nb_util__trace_event *, size_t), void *ud) {
  pthread_mutex_lock(&registry_mu);
  for (tbuf *b = registry; b; b = b->next) {
    pthread_mutex_lock(&b->mu);
    if (b->n) fn(ud, b->tid, b->name, b->ev, b->n);
    pthread_mutex_unlock(&b->mu);
  }
  pthread_mutex_unlock(&registry_mu);
  return atomic_load(&dropped);
}

void nb_util__trace_clear(void) {
  pthread_mutex_lock(&registry_mu);
  clear_locked();
  pthread_mutex_unlock(&registry_mu);
}

/* ---- runs of executables ------------------------------------------------------ */

static _Atomic(nb_util__trace_run_hook) run_hook;

void nb_util__trace_set_run_hook(nb_util__trace_run_hook fn) { atomic_store(&run_hook, fn); }

void nb_util__trace_run(const void *exe, uint64_t key, int64_t ns) {
  nb_util__trace_run_hook fn = atomic_load(&run_hook);
  if (fn && nb_util__tracing()) fn(exe, key, ns);
}
