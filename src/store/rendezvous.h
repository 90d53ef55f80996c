/*
 * rendezvous.h - the hook the core calls when the world group goes away
 * (internal).
 */
#ifndef TDIST_STORE_RENDEZVOUS_H
#define TDIST_STORE_RENDEZVOUS_H

/*
 * tdist__rendezvous_cleanup - call once the world group made by
 * tdist_init_process_group is destroyed (caller thread, after the backend
 * released its store use). Every rank counts out on the store; the rank that
 * hosts the server keeps it running until all ranks counted out (bounded by
 * the init timeout), then stops it. Idempotent; 0 or a store error (the
 * cleanup still completes).
 */
int tdist__rendezvous_cleanup(void);

#endif
