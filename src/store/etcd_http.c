/*
 * etcd_http.c - see etcd.h: requests to etcd's JSON gRPC gateway over
 * libcurl, with failover over the endpoints, and watch streams.
 *
 * Each handle owns one curl easy handle (keep-alive connections are reused
 * from call to call) and one multi handle, used only by watches so that
 * another thread can interrupt them (curl_multi_wakeup). Which endpoint is
 * current sticks until it fails: a killed member costs one refused connect.
 *
 * Threads: the owner's (see etcd.h); `woken` is the only field another
 * thread touches.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "store/etcd.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/param.h"

/* etcd refuses a request whose protobuf encoding exceeds its
 * --max-request-bytes (1.5 MiB by default) with "request is too large";
 * the client refuses it before sending (tdist__etcd_post). */
TDIST_PARAM(EtcdMaxRequest, "TDIST_STORE_ETCD_MAX_REQUEST_BYTES", 1572864)
/* Room left for what the estimate does not see (the raft entry's header). */
#define REQUEST_SLACK 64

#define CONNECT_MS 2000 /* a member that does not accept within this is skipped */
#define BACKOFF_MAX_MS 500
/* Every member refusing connections this long: the cluster is gone (the TCP
 * store's "connection closed"); a leader election answers, so it waits on. */
#define GIVEUP_MS 3000

struct tdist__etcd_http {
  char **eps; /* "http://host:port" */
  int n, cur;
  CURL *easy;
  CURLM *multi;
  struct curl_slist *hdrs;
  tdist__buf_t body; /* the answer being received */
  unsigned seed;
  _Atomic int woken;
  int64_t giveup_ms; /* fail with CLOSED after this long without any member accepting */
  char why[320];
  char errbuf[CURL_ERROR_SIZE];
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_init_rc;
static void global_init(void) { g_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT) == 0 ? 0 : -1; }

/* ---- base64 and fields ---------------------------------------------------------- */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

json_object *tdist__etcd_b64(const void *p, size_t n) {
  const uint8_t *s = p;
  size_t ol = 4 * ((n + 2) / 3);
  char *o = tdist__malloc(ol + 1);
  if (!o) return NULL;
  size_t j = 0;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
                 (i + 2 < n ? s[i + 2] : 0);
    o[j++] = B64[v >> 18 & 63];
    o[j++] = B64[v >> 12 & 63];
    o[j++] = i + 1 < n ? B64[v >> 6 & 63] : '=';
    o[j++] = i + 2 < n ? B64[v & 63] : '=';
  }
  json_object *js = json_object_new_string_len(o, (int)ol);
  tdist__free(o);
  return js;
}

static int b64val(int c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  return c == '+' || c == '-' ? 62 : c == '/' || c == '_' ? 63 : -1;
}

int tdist__etcd_unb64(json_object *o, const char *name, uint8_t **out, size_t *n) {
  json_object *f = NULL;
  *out = NULL;
  *n = 0;
  if (!o || !json_object_object_get_ex(o, name, &f)) return 0;
  const char *s = json_object_get_string(f);
  size_t sl = (size_t)json_object_get_string_len(f);
  uint8_t *d = tdist__malloc(sl / 4 * 3 + 3);
  if (!d) return -1;
  size_t j = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < sl && s[i] != '='; i++) {
    int v = b64val((unsigned char)s[i]);
    if (v < 0) {
      tdist__free(d);
      return -1;
    }
    acc = acc << 6 | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      d[j++] = (uint8_t)(acc >> bits);
    }
  }
  *out = d;
  *n = j;
  return 0;
}

int64_t tdist__etcd_i64(json_object *o, const char *name, int64_t dflt) {
  json_object *f = NULL;
  if (!o || !json_object_object_get_ex(o, name, &f)) return dflt;
  return json_object_get_int64(f); /* json-c parses numeric strings too */
}

/* ---- handles ----------------------------------------------------------------------- */

int tdist__etcd_http_new(char *const *endpoints, int n, tdist__etcd_http_t **out) {
  pthread_once(&g_once, global_init);
  if (g_init_rc) return TDIST_ERR_INTERNAL;
  tdist__etcd_http_t *h = tdist__calloc(1, sizeof(*h));
  if (!h) return TDIST_ERR_NO_MEMORY;
  h->eps = tdist__calloc((size_t)n, sizeof(char *));
  h->n = n;
  h->easy = curl_easy_init();
  h->multi = curl_multi_init();
  h->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
  if (h->hdrs) h->hdrs = curl_slist_append(h->hdrs, "Expect:"); /* no 100-continue pause */
  if (!h->eps || !h->easy || !h->multi || !h->hdrs) goto nomem;
  for (int i = 0; i < n; i++) {
    size_t l = strlen(endpoints[i]) + 8;
    if (!(h->eps[i] = tdist__malloc(l))) goto nomem;
    snprintf(h->eps[i], l, "http://%s", endpoints[i]);
  }
  h->seed = (unsigned)(getpid() ^ tdist__now_ns() ^ (uintptr_t)h);
  h->cur = n > 1 ? (int)(h->seed % (unsigned)n) : 0; /* spread clients over members */
  atomic_init(&h->woken, 0);
  h->giveup_ms = GIVEUP_MS;
  *out = h;
  return 0;
nomem:
  tdist__etcd_http_free(h);
  return TDIST_ERR_NO_MEMORY;
}

void tdist__etcd_http_free(tdist__etcd_http_t *h) {
  if (!h) return;
  for (int i = 0; h->eps && i < h->n; i++)
    tdist__free(h->eps[i]);
  tdist__free(h->eps);
  if (h->multi) curl_multi_cleanup(h->multi);
  if (h->easy) curl_easy_cleanup(h->easy);
  curl_slist_free_all(h->hdrs);
  tdist__buf_free(&h->body);
  tdist__free(h);
}

void tdist__etcd_http_wake(tdist__etcd_http_t *h) {
  atomic_store(&h->woken, 1);
  curl_multi_wakeup(h->multi);
}

int tdist__etcd_http_woken(tdist__etcd_http_t *h) { return atomic_load(&h->woken); }

const char *tdist__etcd_http_why(const tdist__etcd_http_t *h) { return h->why; }

void tdist__etcd_http_set_giveup(tdist__etcd_http_t *h, int64_t ms) {
  h->giveup_ms = ms < 0 ? GIVEUP_MS : ms;
}

static size_t collect(char *p, size_t sz, size_t nm, void *arg) {
  tdist__buf_t *b = arg;
  if (tdist__buf_reserve(b, sz * nm + 1)) return 0;
  tdist__put(b, p, sz * nm);
  return sz * nm;
}

static void setup(tdist__etcd_http_t *h, const char *path, const char *body, size_t blen) {
  char url[512];
  snprintf(url, sizeof(url), "%s%s", h->eps[h->cur], path);
  curl_easy_reset(h->easy);
  curl_easy_setopt(h->easy, CURLOPT_URL, url);
  curl_easy_setopt(h->easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h->easy, CURLOPT_HTTPHEADER, h->hdrs);
  curl_easy_setopt(h->easy, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)blen);
  curl_easy_setopt(h->easy, CURLOPT_ERRORBUFFER, h->errbuf);
  curl_easy_setopt(h->easy, CURLOPT_TCP_NODELAY, 1L);
  h->errbuf[0] = 0;
}

/* Parse n bytes of JSON; NULL if malformed. */
static json_object *parse(const uint8_t *p, size_t n) {
  json_tokener *tok = json_tokener_new_ex(64);
  if (!tok) return NULL;
  json_object *o = json_tokener_parse_ex(tok, (const char *)p, (int)n);
  if (json_tokener_get_error(tok) != json_tokener_success) {
    json_object_put(o);
    o = NULL;
  }
  json_tokener_free(tok);
  return o;
}

/* A try's outcome: done; failed for good; to retry, not sent (no
 * connection), refused unapplied by a member that answered (busy), or sent
 * with its answer lost (it may have been applied). */
enum { PO_OK = 0, PO_FINAL, PO_RETRY_UNSENT, PO_RETRY_BUSY, PO_RETRY_SENT };

/* Map an etcd/gRPC error answer to a tdist code; *retry for an unavailable
 * cluster (a leader election under way, a member shutting down), *busy
 * for etcd's back-pressure: "too many requests" (ResourceExhausted) when
 * its applied index lags the committed one by more than 5000 entries, a
 * request refused before it was proposed (so not applied: not ambiguous),
 * retried after the backoff. Seen with 10k clients on one member
 * (docs/scale.md). */
static int grpc_error(tdist__etcd_http_t *h, long http, json_object *o, int *retry, int *busy) {
  json_object *m = NULL;
  const char *msg = "(no message)";
  if (o &&
      (json_object_object_get_ex(o, "error", &m) || json_object_object_get_ex(o, "message", &m)))
    msg = json_object_is_type(m, json_type_string) ? json_object_get_string(m)
                                                   : json_object_to_json_string(m);
  int64_t code = o ? tdist__etcd_i64(o, "code", -1) : -1;
  snprintf(h->why, sizeof(h->why), "%s answered HTTP %ld: %s", h->eps[h->cur], http, msg);
  *busy = strstr(msg, "too many requests") != NULL;
  *retry = code == 14 || code == 4 || code == 10 || (code < 0 && http >= 500) || *busy;
  if (strstr(msg, "too large")) return TDIST_ERR_TOO_LARGE;
  if (code == 3 || code == 5 || code == 9) return TDIST_ERR_INVALID_ARGUMENT;
  return TDIST_ERR_IO;
}

static int post_once(tdist__etcd_http_t *h, const char *path, const char *body, size_t blen,
                     int64_t left, json_object **rep, int *rc) {
  setup(h, path, body, blen);
  h->body.len = 0;
  curl_easy_setopt(h->easy, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(h->easy, CURLOPT_WRITEDATA, &h->body);
  curl_easy_setopt(h->easy, CURLOPT_TIMEOUT_MS, (long)left);
  curl_easy_setopt(h->easy, CURLOPT_CONNECTTIMEOUT_MS,
                   (long)(left < CONNECT_MS ? left : CONNECT_MS));
  CURLcode c = curl_easy_perform(h->easy);
  if (c != CURLE_OK) {
    snprintf(h->why, sizeof(h->why), "%s: %s", h->eps[h->cur],
             h->errbuf[0] ? h->errbuf : curl_easy_strerror(c));
    *rc = c == CURLE_OPERATION_TIMEDOUT ? TDIST_ERR_TIMEOUT : TDIST_ERR_CLOSED;
    if (c == CURLE_COULDNT_CONNECT || c == CURLE_COULDNT_RESOLVE_HOST) return PO_RETRY_UNSENT;
    if (c == CURLE_OPERATION_TIMEDOUT || c == CURLE_GOT_NOTHING || c == CURLE_RECV_ERROR ||
        c == CURLE_SEND_ERROR || c == CURLE_PARTIAL_FILE)
      return PO_RETRY_SENT;
    *rc = c == CURLE_OUT_OF_MEMORY ? TDIST_ERR_NO_MEMORY : TDIST_ERR_IO;
    return PO_FINAL;
  }
  long http = 0;
  curl_easy_getinfo(h->easy, CURLINFO_RESPONSE_CODE, &http);
  json_object *o = parse(h->body.p, h->body.len);
  if (http == 200 && o) {
    *rep = o;
    *rc = 0;
    return PO_OK;
  }
  int retry = 0, busy = 0;
  *rc = http == 200 ? TDIST_ERR_PROTOCOL : grpc_error(h, http, o, &retry, &busy);
  if (http == 200) snprintf(h->why, sizeof(h->why), "%s sent malformed JSON", h->eps[h->cur]);
  json_object_put(o);
  if (retry) *rc = TDIST_ERR_TIMEOUT;
  return busy ? PO_RETRY_BUSY : retry ? PO_RETRY_SENT : PO_FINAL;
}

/* Next endpoint; after a whole round, sleep a jittered backoff. */
static void next_endpoint(tdist__etcd_http_t *h, int *tries, int64_t *backoff, int64_t deadline) {
  h->cur = (h->cur + 1) % h->n;
  if (++*tries % h->n) return;
  int64_t d = *backoff / 2 + (int64_t)(rand_r(&h->seed) % (unsigned)(*backoff + 1));
  int64_t left = deadline - tdist__now_ms();
  if (d > left) d = left;
  if (d > 0) {
    struct timespec ts = {d / 1000, (d % 1000) * 1000000};
    nanosleep(&ts, NULL);
  }
  if (*backoff < BACKOFF_MAX_MS) *backoff *= 2;
}

/* What etcd counts of a request, its protobuf size, estimated from the JSON
 * from above: base64 fields (key, value, range_end) decoded, other strings
 * as written, numbers 8 bytes, and 6 bytes of tag and length per field and
 * element. Over by at most a few bytes per field, never under. */
static uint64_t request_bytes(json_object *o) {
  uint64_t n = 0;
  switch (json_object_get_type(o)) {
  case json_type_object: {
    json_object_object_foreach(o, k, v) {
      int b64 = !strcmp(k, "key") || !strcmp(k, "value") || !strcmp(k, "range_end");
      if (b64 && json_object_is_type(v, json_type_string))
        n += (uint64_t)json_object_get_string_len(v) / 4 * 3 + 6;
      else
        n += request_bytes(v) + 6;
    }
    return n;
  }
  case json_type_array:
    for (size_t i = 0, len = json_object_array_length(o); i < len; i++)
      n += request_bytes(json_object_array_get_idx(o, i)) + 6;
    return n;
  case json_type_string: return (uint64_t)json_object_get_string_len(o);
  default: return 8;
  }
}

int tdist__etcd_post(tdist__etcd_http_t *h, const char *path, json_object *req, int64_t deadline_ms,
                     json_object **rep, int *ambiguous) {
  *rep = NULL;
  if (!req) {
    snprintf(h->why, sizeof(h->why), "out of memory for the request");
    return TDIST_ERR_NO_MEMORY;
  }
  int64_t max = tdist__param_EtcdMaxRequest();
  uint64_t est = max > 0 ? request_bytes(req) + REQUEST_SLACK : 0;
  if (max > 0 && est > (uint64_t)max) {
    snprintf(h->why, sizeof(h->why),
             "the request (about %" PRIu64
             " bytes) exceeds TDIST_STORE_ETCD_MAX_REQUEST_BYTES=%" PRId64
             ", etcd's --max-request-bytes (1.5 MiB by default): not sent; raise both for "
             "larger values",
             est, max);
    json_object_put(req);
    return TDIST_ERR_TOO_LARGE;
  }
  size_t blen = 0;
  const char *body = json_object_to_json_string_length(
      req, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &blen);
  int rc = TDIST_ERR_TIMEOUT, tries = 0;
  int64_t backoff = 10, answered = tdist__now_ms();
  snprintf(h->why, sizeof(h->why), "no time left to ask");
  while (body) {
    int64_t left = deadline_ms - tdist__now_ms();
    if (left <= 0) break;
    int r = post_once(h, path, body, blen, left, rep, &rc);
    if (r == PO_OK || r == PO_FINAL) break;
    if (r == PO_RETRY_SENT && ambiguous) *ambiguous = 1;
    if (r != PO_RETRY_UNSENT) {
      answered = tdist__now_ms();
    } else if (h->giveup_ms > 0 && tdist__now_ms() - answered >= h->giveup_ms) {
      rc = TDIST_ERR_CLOSED;
      break;
    }
    next_endpoint(h, &tries, &backoff, deadline_ms);
  }
  if (!body) rc = TDIST_ERR_NO_MEMORY;
  json_object_put(req);
  return rc;
}

/* ---- watch ---------------------------------------------------------------------------- */

typedef struct watch_state {
  tdist__etcd_http_t *h;
  tdist__etcd_event_fn fn;
  void *arg;
  tdist__buf_t line; /* a partial message */
  int done, err;     /* fn said stop; the stream reported an error */
} watch_state_t;

/* One message of the stream: {"result": {..., "events": [...]}} or an error. */
static void watch_message(watch_state_t *w, const uint8_t *p, size_t n) {
  json_object *o = parse(p, n), *res = NULL, *evs = NULL, *f = NULL;
  if (!o) return; /* blank line */
  if (!json_object_object_get_ex(o, "result", &res)) {
    snprintf(w->h->why, sizeof(w->h->why), "%s: watch: %.200s", w->h->eps[w->h->cur],
             json_object_to_json_string(o));
    w->err = 1;
  } else if (json_object_object_get_ex(res, "canceled", &f) && json_object_get_boolean(f)) {
    snprintf(w->h->why, sizeof(w->h->why), "%s: watch canceled (compacted at revision %" PRId64 ")",
             w->h->eps[w->h->cur], tdist__etcd_i64(res, "compact_revision", 0));
    w->err = 1;
  } else if (json_object_object_get_ex(res, "events", &evs)) {
    size_t ne = json_object_array_length(evs);
    int stop = 0; /* every event of the message, then stop: one revision may hold several */
    for (size_t i = 0; i < ne; i++) {
      json_object *ev = json_object_array_get_idx(evs, i), *kv = NULL, *t = NULL;
      int del = json_object_object_get_ex(ev, "type", &t) &&
                strcmp(json_object_get_string(t), "DELETE") == 0;
      uint8_t *k = NULL, *v = NULL;
      size_t kl = 0, vl = 0;
      json_object_object_get_ex(ev, "kv", &kv);
      if (tdist__etcd_unb64(kv, "key", &k, &kl) == 0 &&
          tdist__etcd_unb64(kv, "value", &v, &vl) == 0)
        stop |= w->fn(w->arg, del, k, kl, v, vl, tdist__etcd_i64(kv, "mod_revision", 0));
      tdist__free(k);
      tdist__free(v);
    }
    w->done = stop;
  }
  json_object_put(o);
}

/* curl write callback: split the stream into newline-ended messages. */
static size_t watch_write(char *p, size_t sz, size_t nm, void *arg) {
  watch_state_t *w = arg;
  size_t n = sz * nm;
  for (size_t i = 0; i < n && !w->done && !w->err; i++) {
    if (p[i] != '\n') {
      if (tdist__buf_reserve(&w->line, 1)) return 0;
      w->line.p[w->line.len++] = (uint8_t)p[i];
      continue;
    }
    watch_message(w, w->line.p, w->line.len);
    w->line.len = 0;
  }
  return w->done || w->err ? 0 : n; /* 0 ends the transfer */
}

int tdist__etcd_watch(tdist__etcd_http_t *h, const void *key, size_t klen, const void *range_end,
                      size_t elen, int64_t start_rev, int64_t deadline_ms, tdist__etcd_event_fn fn,
                      void *arg) {
  json_object *req = json_object_new_object(), *cr = json_object_new_object();
  if (!req || !cr) {
    json_object_put(cr);
    goto nomem;
  }
  json_object_object_add(req, "create_request", cr);
  json_object_object_add(cr, "key", tdist__etcd_b64(key, klen));
  if (range_end) json_object_object_add(cr, "range_end", tdist__etcd_b64(range_end, elen));
  json_object_object_add(cr, "start_revision", json_object_new_int64(start_rev));
  size_t blen = 0;
  const char *body = json_object_to_json_string_length(
      req, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &blen);
  if (!body) goto nomem;
  watch_state_t w = {.h = h, .fn = fn, .arg = arg};
  int rc = TDIST_ERR_TIMEOUT, tries = 0;
  int64_t backoff = 10;
  while (!w.done && !w.err) {
    if (atomic_load(&h->woken)) {
      rc = TDIST_ERR_CLOSED;
      snprintf(h->why, sizeof(h->why), "the watch was stopped");
      break;
    }
    int64_t left = deadline_ms - tdist__now_ms();
    if (left <= 0) {
      rc = TDIST_ERR_TIMEOUT;
      break;
    }
    setup(h, "/v3/watch", body, blen);
    w.line.len = 0;
    curl_easy_setopt(h->easy, CURLOPT_WRITEFUNCTION, watch_write);
    curl_easy_setopt(h->easy, CURLOPT_WRITEDATA, &w);
    curl_easy_setopt(h->easy, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(left < CONNECT_MS ? left : CONNECT_MS));
    curl_multi_add_handle(h->multi, h->easy);
    int running = 1;
    CURLcode res = CURLE_OK;
    while (!w.done && !w.err && !atomic_load(&h->woken) && deadline_ms > tdist__now_ms()) {
      curl_multi_perform(h->multi, &running);
      int q;
      for (CURLMsg *m; (m = curl_multi_info_read(h->multi, &q));)
        if (m->msg == CURLMSG_DONE) res = m->data.result;
      if (!running || w.done || w.err) break;
      int64_t wait = deadline_ms - tdist__now_ms();
      curl_multi_poll(h->multi, NULL, 0, wait > 1000 ? 1000 : wait > 0 ? (int)wait : 0, NULL);
    }
    curl_multi_remove_handle(h->multi, h->easy);
    if (w.done || w.err || running) continue; /* running: deadline or wake, checked above */
    /* The stream ended (a member went away): the same revision elsewhere. */
    snprintf(h->why, sizeof(h->why), "%s: watch ended: %s", h->eps[h->cur],
             h->errbuf[0] ? h->errbuf : curl_easy_strerror(res));
    next_endpoint(h, &tries, &backoff, deadline_ms);
  }
  tdist__buf_free(&w.line);
  json_object_put(req);
  return w.done ? 0 : w.err ? TDIST_ERR_PROTOCOL : rc;
nomem:
  json_object_put(req);
  snprintf(h->why, sizeof(h->why), "out of memory for the watch");
  return TDIST_ERR_NO_MEMORY;
}
