/*
 * list.h - intrusive doubly linked lists, in the manner of libuv's queue.h
 * (internal).
 *
 * A list is a sentinel node (tdist__list_t) whose next/prev point at itself
 * when empty; an element embeds a tdist__list_t and is found again with
 * tdist__list_entry (container_of). Every operation is O(1): appending no
 * longer walks to the tail, and an element unlinks itself without knowing
 * which list it is on. A node that was removed (or initialised) points at
 * itself, so tdist__list_linked tells whether it is on a list.
 *
 * Thread safety: none; each list has one owner (the comments at each list
 * name it, e.g. "(progress)").
 */
#ifndef TDIST_UTIL_LIST_H
#define TDIST_UTIL_LIST_H

#include <stddef.h>

#include "tdist/list.h"

/* The public link (the backend interface carries it in every op). */
typedef tdist_list_t tdist__list_t;

#define tdist__list_entry(ptr, type, member) \
  ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

static inline void tdist__list_init(tdist__list_t *h) { h->next = h->prev = h; }

static inline int tdist__list_empty(const tdist__list_t *h) { return h->next == h; }

/* 1 if node n is on some list (0 after init or remove). */
static inline int tdist__list_linked(const tdist__list_t *n) { return n->next != n; }

static inline void tdist__list_insert_before(tdist__list_t *pos, tdist__list_t *n) {
  n->next = pos;
  n->prev = pos->prev;
  pos->prev->next = n;
  pos->prev = n;
}

static inline void tdist__list_push_back(tdist__list_t *h, tdist__list_t *n) {
  tdist__list_insert_before(h, n);
}

static inline void tdist__list_push_front(tdist__list_t *h, tdist__list_t *n) {
  tdist__list_insert_before(h->next, n);
}

/* Unlink n from whatever list holds it; n then points at itself. */
static inline void tdist__list_remove(tdist__list_t *n) {
  n->prev->next = n->next;
  n->next->prev = n->prev;
  n->next = n->prev = n;
}

/* First node, or NULL when empty. */
static inline tdist__list_t *tdist__list_first(const tdist__list_t *h) {
  return h->next == h ? NULL : h->next;
}

/* The node after n on list h, or NULL at the end. */
static inline tdist__list_t *tdist__list_next(const tdist__list_t *h, const tdist__list_t *n) {
  return n->next == h ? NULL : n->next;
}

/* Move every node of `from` to the end of `to`; `from` becomes empty. */
static inline void tdist__list_splice(tdist__list_t *to, tdist__list_t *from) {
  if (tdist__list_empty(from)) return;
  from->next->prev = to->prev;
  to->prev->next = from->next;
  from->prev->next = to;
  to->prev = from->prev;
  tdist__list_init(from);
}

/* Iterate over the nodes of h; `n` may not be removed inside the body. */
#define tdist__list_foreach(n, h) for ((n) = (h)->next; (n) != (h); (n) = (n)->next)

/* Iterate with `tmp` holding the next node, so `n` may be removed. */
#define tdist__list_foreach_safe(n, tmp, h) \
  for ((n) = (h)->next, (tmp) = (n)->next; (n) != (h); (n) = (tmp), (tmp) = (n)->next)

#endif
