// errors.h: releasing what the shim hands over.
#include "boundary.h"
#include "errors.h"

using namespace vlc;

extern "C" {

void vlc_free_error(char* e) {
  std::free(e);
}

void vlc_free_bytes(uint8_t* p) {
  std::free(p);
}

}  // extern "C"
