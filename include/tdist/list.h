/*
 * tdist/list.h - the intrusive list link of the backend interface
 * (tdist/backend.h: tdist_backend_op_t.link). The core keeps circular lists
 * with a head node; a backend may put its ops on lists of its own through
 * the link while it owns them.
 */
#ifndef TDIST_LIST_H
#define TDIST_LIST_H

typedef struct tdist_list {
  struct tdist_list *next, *prev;
} tdist_list_t;

#endif /* TDIST_LIST_H */
