/*
 * unixsock.c - see unixsock.h.
 */
#include "util/unixsock.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

int tdist__unix_connect(const char *name, int64_t send_timeout_ms) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  size_t nl = strlen(name);
  if (nl == 0 || nl + 1 > sizeof(a.sun_path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(a.sun_path + 1, name, nl); /* abstract: leading NUL */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (send_timeout_ms > 0) {
    struct timeval tv = {(time_t)(send_timeout_ms / 1000),
                         (suseconds_t)((send_timeout_ms % 1000) * 1000)};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  if (connect(fd, (struct sockaddr *)&a,
              (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl)) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int tdist__send_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}
