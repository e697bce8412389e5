#!/bin/sh
# Lay out NVIDIA's CUDA binaries, unpacked from Debian's packages, the way an nvidia/cuda:<ver>-devel image
# has them: /usr/local/cuda-<ver>/{bin,nvvm,targets/x86_64-linux/{include,lib}} with include and lib64 links.
# Usage: assemble-cuda.sh UNPACKED_ROOT CUDA_VERSION "PACKAGE=VERSION ..."   (run by docker/cuda-standin/Dockerfile)
# Debian's own /usr/bin/nvcc (a shell wrapper) and its g++/gcc wrappers (they pin a host compiler) are not
# copied: in the real images nvcc takes the host compiler from PATH or -ccbin, and so does this stand-in.
set -eu
X=$1
V=$2
DEBS=$3
P=/usr/local/cuda-$V
T=$P/targets/x86_64-linux
D=$X/usr/lib/nvidia-cuda-toolkit
L=$X/usr/lib/x86_64-linux-gnu

mkdir -p "$P/bin/crt" "$P/nvvm/bin" "$P/nvvm/libdevice" "$P/nvvm/lib64" "$P/nvvm/include" "$T/include" "$T/lib/stubs"
cp -a "$D/bin/nvcc" "$P/bin/"
cp -a "$D/bin/crt/." "$P/bin/crt/"
for tool in ptxas fatbinary nvlink cudafe++ bin2c cuobjdump nvdisasm nvprune cu++filt __nvcc_device_query; do
    cp -a "$X/usr/bin/$tool" "$P/bin/"
done
cp -a "$D/bin/cicc" "$P/nvvm/bin/"
cp -a "$D/libdevice/." "$P/nvvm/libdevice/"
cp -a "$L"/libnvvm.so* "$P/nvvm/lib64/"
mv "$X/usr/include/nvvm.h" "$P/nvvm/include/"
rm -rf "$X/usr/include/cuda-gdb"
cp -a "$X/usr/include/." "$T/include/"
cp -a "$L"/libcudart.so* "$L/libcudart_static.a" "$L/libcudadevrt.a" "$L/libculibos.a" "$T/lib/"
cp -a "$L/stubs/." "$T/lib/stubs/"
ln -s targets/x86_64-linux/include "$P/include"
ln -s targets/x86_64-linux/lib "$P/lib64"

# NVIDIA's nvcc.profile (the one its installers and images ship), not Debian's /etc/nvcc.profile.
cat > "$P/bin/nvcc.profile" <<'PROFILE'

TOP              = $(_HERE_)/..

CICC_PATH        = $(TOP)/nvvm/bin
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice

LD_LIBRARY_PATH += $(TOP)/lib:
PATH            += $(CICC_PATH):$(_HERE_):

INCLUDES        +=  "-I$(TOP)/$(_TARGET_DIR_)/include" $(_SPACE_)

LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)/stubs" "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)"

CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
PROFILE

{
    echo "attnforge STAND-IN for an nvidia/cuda:$V-devel image (NOT an NVIDIA image)."
    echo "NVIDIA's CUDA $V binaries and headers as repackaged by Debian (non-free), unpacked with dpkg -x:"
    for d in $DEBS; do echo "  $d"; done
    echo "Left out (the real devel image has them): cuBLAS, cuFFT, cuRAND, cuSOLVER, cuSPARSE, NPP, nvJPEG,"
    echo "nvrtc and nvJitLink shared libraries (their headers and link stubs are here), Nsight, cuda-gdb."
} > "$P/ATTNFORGE-STANDIN"

"$P/bin/nvcc" --version | tail -n 2
