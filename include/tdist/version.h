/*
 * tdist/version.h - version of the headers; tdist_version() gives the
 * version of the library actually loaded.
 */
#ifndef TDIST_VERSION_H
#define TDIST_VERSION_H

#define TDIST_VERSION_MAJOR 0
#define TDIST_VERSION_MINOR 1
#define TDIST_VERSION_PATCH 0
/* One integer that compares: 10000*major + 100*minor + patch. */
#define TDIST_VERSION_CODE \
  (TDIST_VERSION_MAJOR * 10000 + TDIST_VERSION_MINOR * 100 + TDIST_VERSION_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/*
 * tdist_version - version of the loaded library.
 * @param major, minor, patch  out-params, each may be NULL.
 * @return TDIST_VERSION_CODE of the library (compare with the header's to
 *         detect a mismatched install). Any thread.
 */
int tdist_version(int *major, int *minor, int *patch);

/* tdist_version_string - e.g. "0.1.0 (cpu, nccl 2.28.9)". Static string. */
const char *tdist_version_string(void);

#ifdef __cplusplus
}
#endif
#endif /* TDIST_VERSION_H */
