//! The memory of this node's CUDA devices, read from the driver (`libcuda.so.1`, loaded at run
//! time) before any rank starts: a CPU build of libtorch links no CUDA, and asking the driver
//! for a device's total memory creates no context on it.

use std::ffi::{CStr, c_int, c_void};

type CuInit = unsafe extern "C" fn(u32) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;

/// The smallest total memory (bytes) of the first `devices` CUDA devices this process sees
/// (`CUDA_VISIBLE_DEVICES` applies), or why it cannot be read.
pub fn smallest_device_bytes(devices: usize) -> Result<u64, String> {
    // SAFETY: the library handle is checked before use; each symbol is the driver API's
    // function of that name with the signature declared above; every out-pointer is a local.
    unsafe {
        let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if lib.is_null() {
            return Err("the CUDA driver (libcuda.so.1) is not installed".into());
        }
        let sym = |name: &CStr| -> Result<*mut c_void, String> {
            let p = libc::dlsym(lib, name.as_ptr());
            if p.is_null() {
                Err(format!("libcuda.so.1 has no {}", name.to_string_lossy()))
            } else {
                Ok(p)
            }
        };
        let init: CuInit = std::mem::transmute(sym(c"cuInit")?);
        let get: CuDeviceGet = std::mem::transmute(sym(c"cuDeviceGet")?);
        let total: CuDeviceTotalMem = std::mem::transmute(sym(c"cuDeviceTotalMem_v2")?);
        let rc = init(0);
        if rc != 0 {
            return Err(format!(
                "the CUDA driver did not initialise (cuInit error {rc})"
            ));
        }
        let mut smallest = u64::MAX;
        for ordinal in 0..devices.max(1) {
            let mut device: c_int = 0;
            let rc = get(&mut device, ordinal as c_int);
            if rc != 0 {
                return Err(format!("no CUDA device {ordinal} (cuDeviceGet error {rc})"));
            }
            let mut bytes: usize = 0;
            let rc = total(&mut bytes, device);
            if rc != 0 {
                return Err(format!(
                    "CUDA device {ordinal}'s memory unreadable (cuDeviceTotalMem error {rc})"
                ));
            }
            smallest = smallest.min(bytes as u64);
        }
        Ok(smallest)
    }
}

#[cfg(test)]
mod tests {
    /// Where the driver is installed the devices have memory; elsewhere the reason names it.
    #[test]
    fn the_driver_answers_or_is_named() {
        match super::smallest_device_bytes(1) {
            Ok(bytes) => assert!(bytes > 0),
            Err(why) => assert!(why.contains("libcuda") || why.contains("CUDA"), "{why}"),
        }
    }
}
