//! `ngpus ngpus_free gpu_ut gpu_mem_free`: NVIDIA GPUs through NVML, loaded at run time with
//! `dlopen("libnvidia-ml.so.1")` so that the agent has no build- or link-time dependency on
//! the driver.
//!
//! - `ngpus`: devices NVML reports.
//! - `ngpus_free`: devices with no running compute process.
//! - `gpu_ut`: mean over the devices of `nvmlDeviceGetUtilizationRates().gpu` (%, the share
//!   of the driver's last sample period in which a kernel ran). Devices that do not report
//!   it (MIG mode: NOT_SUPPORTED) are left out of the mean.
//! - `gpu_mem_free`: free memory of all devices together, MB.
//!
//! No library, an NVML that does not initialise (no driver loaded) or zero devices: the
//! indices are absent with that reason, not failed; the sampler does not retry (a driver
//! installed later is picked up when the agent restarts). A device call that fails marks
//! the indices it feeds failed for that tick.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::path::Path;

use super::{Ix, Slots, MIB};

const ALL: [Ix; 4] = [Ix::Ngpus, Ix::NgpusFree, Ix::GpuUt, Ix::GpuMemFree];
const PER_DEVICE: [Ix; 3] = [Ix::NgpusFree, Ix::GpuUt, Ix::GpuMemFree];

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_NOT_SUPPORTED: c_int = 3;
const NVML_ERROR_INSUFFICIENT_SIZE: c_int = 7;

type Device = *mut c_void;

// Laid out as NVML's C structs; NVML writes every field, we read some.
#[repr(C)]
#[derive(Default)]
#[allow(dead_code)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
#[derive(Default)]
#[allow(dead_code)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

type Shutdown = unsafe extern "C" fn() -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type UtilizationFn = unsafe extern "C" fn(Device, *mut Utilization) -> c_int;
type MemoryFn = unsafe extern "C" fn(Device, *mut Memory) -> c_int;
type ProcessesFn = unsafe extern "C" fn(Device, *mut c_uint, *mut c_void) -> c_int;

/// The NVML entry points we call, resolved once.
struct Api {
    handle: *mut c_void,
    shutdown: Shutdown,
    error_string: ErrorString,
    utilization: UtilizationFn,
    memory: MemoryFn,
    /// Called with a zero-length buffer: SUCCESS = no process, INSUFFICIENT_SIZE = some.
    processes: ProcessesFn,
}

pub(crate) struct Gpu {
    nvml: Option<(Api, Vec<Device>)>,
}

// SAFETY: NVML is documented thread-safe, and the sampler is used from one thread at a time.
unsafe impl Send for Gpu {}

impl Gpu {
    pub(crate) fn load(library: &Path, slots: &mut Slots) -> Self {
        // SAFETY: `open` only calls NVML's documented C API with valid arguments.
        match unsafe { open(library) } {
            Ok(nvml) => Self { nvml: Some(nvml) },
            Err(why) => {
                slots.absent(&ALL, &why);
                Self { nvml: None }
            }
        }
    }

    pub(crate) fn sample(&mut self, slots: &mut Slots) {
        let Some((api, devices)) = &self.nvml else {
            return;
        };
        slots.ok(Ix::Ngpus, devices.len() as f64);
        let (mut free, mut ut_sum, mut ut_count, mut mem) = (0usize, 0.0f64, 0usize, 0u64);
        for (i, &dev) in devices.iter().enumerate() {
            // SAFETY: `dev` came from nvmlDeviceGetHandleByIndex; out-pointers are valid locals.
            let result = unsafe { device_state(api, dev) };
            match result {
                Ok((idle, ut, m)) => {
                    free += usize::from(idle);
                    if let Some(u) = ut {
                        ut_sum += f64::from(u);
                        ut_count += 1;
                    }
                    mem = mem.saturating_add(m);
                }
                Err(e) => return slots.fail(&PER_DEVICE, format!("NVML, GPU {i}: {e}")),
            }
        }
        slots.ok(Ix::NgpusFree, free as f64);
        slots.ok(Ix::GpuMemFree, mem as f64 / MIB);
        if ut_count == 0 {
            slots.fail(&[Ix::GpuUt], "NVML: no GPU reports utilisation (MIG mode?)");
        } else {
            slots.ok(Ix::GpuUt, ut_sum / ut_count as f64);
        }
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if let Some((api, _)) = self.nvml.take() {
            // SAFETY: NVML was initialised by `open`; nothing uses it after this.
            unsafe {
                (api.shutdown)();
                libc::dlclose(api.handle);
            }
        }
    }
}

/// (no compute process, utilisation % if the device reports one (not under MIG), free bytes)
unsafe fn device_state(api: &Api, dev: Device) -> Result<(bool, Option<u32>, u64), String> {
    let mut util = Utilization::default();
    let ut = match (api.utilization)(dev, &mut util) {
        NVML_SUCCESS => Some(util.gpu),
        NVML_ERROR_NOT_SUPPORTED => None,
        rc => return Err(format!("utilisation: {}", message(api, rc))),
    };
    let mut mem = Memory::default();
    check(api, (api.memory)(dev, &mut mem), "memory")?;
    let mut count: c_uint = 0;
    let idle = match (api.processes)(dev, &mut count, std::ptr::null_mut()) {
        NVML_SUCCESS => count == 0,
        NVML_ERROR_INSUFFICIENT_SIZE => false,
        rc => return Err(format!("compute processes: {}", message(api, rc))),
    };
    Ok((idle, ut, mem.free))
}

unsafe fn check(api: &Api, rc: c_int, what: &str) -> Result<(), String> {
    if rc == NVML_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {}", message(api, rc)))
    }
}

unsafe fn message(api: &Api, rc: c_int) -> String {
    let p = (api.error_string)(rc);
    if p.is_null() {
        format!("NVML error {rc}")
    } else {
        format!("{} (NVML error {rc})", CStr::from_ptr(p).to_string_lossy())
    }
}

unsafe fn symbol(handle: *mut c_void, names: &[&CStr]) -> Result<*mut c_void, String> {
    for name in names {
        let p = libc::dlsym(handle, name.as_ptr());
        if !p.is_null() {
            return Ok(p);
        }
    }
    Err(format!("NVML library lacks {}", names[0].to_string_lossy()))
}

unsafe fn open(library: &Path) -> Result<(Api, Vec<Device>), String> {
    let name = CString::new(library.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("bad NVML library path {}", library.display()))?;
    let handle = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
    if handle.is_null() {
        let err = libc::dlerror();
        let why = if err.is_null() {
            "not found".into()
        } else {
            CStr::from_ptr(err).to_string_lossy().into_owned()
        };
        return Err(format!(
            "no NVIDIA driver: cannot load {} ({why})",
            library.display()
        ));
    }
    let loaded = resolve(handle);
    if loaded.is_err() {
        libc::dlclose(handle);
    }
    loaded
}

unsafe fn resolve(handle: *mut c_void) -> Result<(Api, Vec<Device>), String> {
    type Init = unsafe extern "C" fn() -> c_int;
    type Count = unsafe extern "C" fn(*mut c_uint) -> c_int;
    type ByIndex = unsafe extern "C" fn(c_uint, *mut Device) -> c_int;
    let init =
        std::mem::transmute::<*mut c_void, Init>(symbol(handle, &[c"nvmlInit_v2", c"nvmlInit"])?);
    let count = std::mem::transmute::<*mut c_void, Count>(symbol(
        handle,
        &[c"nvmlDeviceGetCount_v2", c"nvmlDeviceGetCount"],
    )?);
    let by_index = std::mem::transmute::<*mut c_void, ByIndex>(symbol(
        handle,
        &[
            c"nvmlDeviceGetHandleByIndex_v2",
            c"nvmlDeviceGetHandleByIndex",
        ],
    )?);
    let api = Api {
        handle,
        shutdown: std::mem::transmute::<*mut c_void, Shutdown>(symbol(handle, &[c"nvmlShutdown"])?),
        error_string: std::mem::transmute::<*mut c_void, ErrorString>(symbol(
            handle,
            &[c"nvmlErrorString"],
        )?),
        utilization: std::mem::transmute::<*mut c_void, UtilizationFn>(symbol(
            handle,
            &[c"nvmlDeviceGetUtilizationRates"],
        )?),
        memory: std::mem::transmute::<*mut c_void, MemoryFn>(symbol(
            handle,
            &[c"nvmlDeviceGetMemoryInfo"],
        )?),
        processes: std::mem::transmute::<*mut c_void, ProcessesFn>(symbol(
            handle,
            &[
                c"nvmlDeviceGetComputeRunningProcesses_v3",
                c"nvmlDeviceGetComputeRunningProcesses_v2",
                c"nvmlDeviceGetComputeRunningProcesses",
            ],
        )?),
    };
    let rc = init();
    if rc != NVML_SUCCESS {
        return Err(format!(
            "NVML does not initialise (is the NVIDIA driver loaded?): {}",
            message(&api, rc)
        ));
    }
    let mut n: c_uint = 0;
    let rc = count(&mut n);
    if rc != NVML_SUCCESS {
        let why = message(&api, rc);
        (api.shutdown)();
        return Err(format!("NVML cannot count GPUs: {why}"));
    }
    if n == 0 {
        (api.shutdown)();
        return Err("no NVIDIA GPU on this host".into());
    }
    let mut devices = Vec::with_capacity(n as usize);
    for i in 0..n {
        let mut dev: Device = std::ptr::null_mut();
        let rc = by_index(i, &mut dev);
        if rc != NVML_SUCCESS {
            let why = message(&api, rc);
            (api.shutdown)();
            return Err(format!("NVML cannot open GPU {i}: {why}"));
        }
        devices.push(dev);
    }
    Ok((api, devices))
}
