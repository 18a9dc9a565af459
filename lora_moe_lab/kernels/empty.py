"""Empty Triton kernels: the floor of a launch (scheduling programs and retiring them), the
yardstick for what an all-disabled LoRA launch costs.

`empty_kernel` takes one pointer (the one-program floor). `empty_args_kernel` takes the aligned
LoRA kernel's 12 pointers and 23 integers (kernels/fused_moe_lora.py), so a benchmark can launch it
with the very grid and arguments of a LoRA launch: the fair reference for an all-disabled launch
(the decode kernel has its own, `lora_delta_decode(..., empty=True)`). `flag_exit_kernel` adds the
one device load that any exit decided from device data needs."""
import triton
import triton.language as tl


@triton.jit
def empty_kernel(x_ptr):
    pass


@triton.jit
def empty_args_kernel(p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11,
                      i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17, i18, i19,
                      i20, i21, i22):
    pass


@triton.jit
def flag_exit_kernel(flag_ptr, out_ptr):
    """Every program loads one int32 from device memory and returns when it is 0: the floor of any
    launch whose programs decide from device data to exit (one round trip to L2/HBM on top of
    `empty_kernel`). Launched with a LoRA launch's grid it bounds what an all-disabled exit can cost."""
    if tl.load(flag_ptr) != 0:
        tl.store(out_ptr + tl.program_id(0), 1)
