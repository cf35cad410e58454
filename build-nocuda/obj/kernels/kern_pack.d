/work/wt-gpu-speed/build-nocuda/obj/kernels/kern_pack.o: \
 kernels/kern_pack.c /work/wt-gpu-speed/kernels/kern.h \
 /work/wt-gpu-speed/kernels/kern_batch.h \
 /work/wt-gpu-speed/kernels/kern_fmt.h \
 /work/wt-gpu-speed/kernels/kern_pack.h
/work/wt-gpu-speed/kernels/kern.h:
/work/wt-gpu-speed/kernels/kern_batch.h:
/work/wt-gpu-speed/kernels/kern_fmt.h:
/work/wt-gpu-speed/kernels/kern_pack.h:
