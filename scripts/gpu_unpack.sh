#!/usr/bin/env bash
# Unpacks the binaries in .gpu/ on the GPU machine: *.xz (python's lzma, in case xz is missing
# there) or *.gz. Every scripts/gpu_*.sh runs this first.
shopt -s nullglob
for f in .gpu/*.xz .gpu/*.gz; do
  b=${f%.*}
  if [ ! -x "$b" ]; then
    case $f in
      *.xz) python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$f" "$b" ;;
      *.gz) gunzip -kf "$f" ;;
    esac
  fi
  chmod +x "$b"
done
