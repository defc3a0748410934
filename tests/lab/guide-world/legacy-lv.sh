# Before adopt-lv.md: the thin LV vg0/legacy that another tool made, with an
# ext4 filesystem holding data, idle.
set -euo pipefail
lvcreate -q -y -V 1G -T vg0/thin0 -n legacy
mkfs.ext4 -q -F /dev/vg0/legacy
mkdir -p legacy-mnt
mount /dev/vg0/legacy legacy-mnt
echo "written before the adoption" > legacy-mnt/report.txt
umount legacy-mnt
rmdir legacy-mnt
