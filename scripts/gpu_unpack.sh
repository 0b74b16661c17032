#!/usr/bin/env bash
# Unpacks the binaries in .gpu/ on the GPU machine: *.tar.xz (several binaries in one archive,
# whose shared kernels xz stores once), *.xz (python's lzma, in case xz is missing there) or
# *.gz. Every scripts/gpu_*.sh runs this first.
shopt -s nullglob
for f in .gpu/*.tar.xz; do
  python3 -c "import tarfile,sys; tarfile.open(sys.argv[1], 'r:xz').extractall('.gpu')" "$f"
done
for f in .gpu/*.xz .gpu/*.gz; do
  case $f in *.tar.xz) continue ;; esac
  b=${f%.*}
  if [ ! -x "$b" ]; then
    case $f in
      *.xz) python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$f" "$b" ;;
      *.gz) gunzip -kf "$f" ;;
    esac
  fi
  chmod +x "$b"
done
for b in .gpu/bench .gpu/kernel_check .gpu/graph_check; do [ -f "$b" ] && chmod +x "$b"; done
