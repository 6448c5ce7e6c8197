//! The pure half of the NCCL binding: type and operator codes, result codes to errors, and
//! the communicator configuration. Nothing here calls into NCCL.

use std::os::raw::{c_char, c_int, c_uint};

use cudarc::driver::DriverError;
use cudarc::nccl::sys;

use crate::dtype::DType;
use crate::error::CommError;
use crate::reduce_op::ReduceOp;

/// NCCL's code for an element type.
pub(crate) fn data_type(d: DType) -> sys::ncclDataType_t {
    match d {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::Bf16 => sys::ncclDataType_t::ncclBfloat16,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::I32 => sys::ncclDataType_t::ncclInt32,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
    }
}

/// NCCL's code for a reduction; `Avg` is NCCL's own `ncclAvg` (sum, then a division by the
/// rank count in the element type), so half-precision averages may differ from the local
/// backend's f32-accumulated ones in the last bit. Integer sums wrap in NCCL as here; avg on
/// integers never reaches NCCL (`Group` refuses it, as every collective does).
pub(crate) fn red_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
    }
}

/// A failed NCCL call, with NCCL's name and number for the code.
pub(crate) fn nccl_error(call: &'static str, code: sys::ncclResult_t) -> CommError {
    CommError::Vendor {
        backend: "nccl",
        call,
        name: format!("{code:?}"),
        code: i64::from(code as u32),
    }
}

/// A failed CUDA driver call.
pub(crate) fn driver_error(call: &'static str) -> impl Fn(DriverError) -> CommError {
    move |e| CommError::Vendor {
        backend: "cuda",
        call,
        name: format!("{:?}", e.0),
        code: i64::from(e.0 as u32),
    }
}

/// `Ok(true)` when a call on a non-blocking communicator is still in progress.
pub(crate) fn check(call: &'static str, code: sys::ncclResult_t) -> Result<bool, CommError> {
    match code {
        sys::ncclResult_t::ncclSuccess => Ok(false),
        sys::ncclResult_t::ncclInProgress => Ok(true),
        other => Err(nccl_error(call, other)),
    }
}

/// `NCCL_VERSION(2, 17, 0)`: the header version whose `ncclConfig_t` [`ConfigV2_17`] mirrors.
pub(crate) const CONFIG_VERSION: c_uint = 2 * 10_000 + 17 * 100;
/// `NCCL_CONFIG_UNDEF_INT`: "use NCCL's default".
const UNDEF: c_int = c_int::MIN;

/// `ncclConfig_t` as NCCL 2.17's `nccl.h` lays it out. NCCL copies `min(size, its own size)`
/// bytes of a caller's config and fills the rest with defaults, so a program built against
/// the 2.17 header keeps working with later libraries; we pass this layout rather than
/// cudarc's newest one so that an older `libnccl` never reads past our struct.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct ConfigV2_17 {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

impl ConfigV2_17 {
    /// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`: every call returns at once (possibly
    /// `ncclInProgress`) so that init, split and collectives can all be bounded by a timeout.
    pub(crate) fn non_blocking() -> Self {
        ConfigV2_17 {
            size: std::mem::size_of::<Self>(),
            magic: 0xcafe_beef,
            version: CONFIG_VERSION,
            blocking: 0,
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
            split_share: UNDEF,
        }
    }

    /// The pointer NCCL's functions take.
    pub(crate) fn as_nccl(&mut self) -> *mut sys::ncclConfig_t {
        (self as *mut Self).cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn dtypes_map_to_nccls_codes() {
        // The numbers are nccl.h's: ncclInt32 = 2, ncclInt64 = 4, ncclFloat16 = 6,
        // ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9.
        assert_eq!(data_type(DType::I32) as u32, 2);
        assert_eq!(data_type(DType::I64) as u32, 4);
        assert_eq!(data_type(DType::F16) as u32, 6);
        assert_eq!(data_type(DType::F32) as u32, 7);
        assert_eq!(data_type(DType::F64) as u32, 8);
        assert_eq!(data_type(DType::Bf16) as u32, 9);
    }

    #[test]
    fn reductions_map_to_nccls_codes() {
        // ncclSum = 0, ncclMax = 2, ncclMin = 3, ncclAvg = 4 (ncclProd = 1 is never used).
        assert_eq!(red_op(ReduceOp::Sum) as u32, 0);
        assert_eq!(red_op(ReduceOp::Max) as u32, 2);
        assert_eq!(red_op(ReduceOp::Min) as u32, 3);
        assert_eq!(red_op(ReduceOp::Avg) as u32, 4);
    }

    #[test]
    fn result_codes_keep_their_name_and_number() {
        assert!(!check("x", sys::ncclResult_t::ncclSuccess).unwrap());
        assert!(check("x", sys::ncclResult_t::ncclInProgress).unwrap());
        let e = check("ncclAllReduce", sys::ncclResult_t::ncclRemoteError).unwrap_err();
        assert_eq!(
            e.to_string(),
            "nccl: ncclAllReduce failed: ncclRemoteError (code 6)"
        );
    }

    #[test]
    fn config_has_the_2_17_header_layout() {
        // size_t size; unsigned magic, version; int blocking, cgaClusterSize, minCTAs,
        // maxCTAs; const char* netName; int splitShare (+ padding) on a 64-bit target.
        assert_eq!(offset_of!(ConfigV2_17, magic), 8);
        assert_eq!(offset_of!(ConfigV2_17, blocking), 16);
        assert_eq!(offset_of!(ConfigV2_17, net_name), 32);
        assert_eq!(offset_of!(ConfigV2_17, split_share), 40);
        assert_eq!(size_of::<ConfigV2_17>(), 48);
        let c = ConfigV2_17::non_blocking();
        assert_eq!(
            (c.size, c.magic, c.version, c.blocking),
            (48, 0xcafe_beef, 21_700, 0)
        );
    }
}
