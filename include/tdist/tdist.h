/*
 * tdist/tdist.h - the whole public API of tdist.
 *
 * tdist gives C and C++ programs process groups, collectives and
 * point-to-point messages that return asynchronous work handles, over NCCL
 * on GPUs and over TCP on CPUs. Start with tdist_init_process_group()
 * (tdist/group.h), run ops (tdist/ops.h), wait on the handles (tdist/work.h),
 * and tdist_group_destroy() at the end.
 */
#ifndef TDIST_TDIST_H
#define TDIST_TDIST_H

#include "tdist/errors.h"
#include "tdist/version.h"
#include "tdist/types.h"
#include "tdist/work.h"
#include "tdist/store.h"
#include "tdist/group.h"
#include "tdist/ops.h"
#include "tdist/debug.h"
#include "tdist/notify.h"
#include "tdist/abi.h"
#include "tdist/mem.h"

#endif /* TDIST_TDIST_H */
