# The mmdebstrap customize hook of cloudweb-test/postgres:17's trixie rootfs
# (see customize-rootfs.sh, whose PostgreSQL part this is): no cluster left
# by the package's postinst, the en_US.UTF-8 locale, the run and data
# directories.
set -e
r=$1
rm -rf "$r/var/lib/postgresql/17" "$r/etc/postgresql/17"
chroot "$r" localedef -i en_US -c -f UTF-8 en_US.UTF-8
chroot "$r" install -d -o postgres -g postgres -m 1777 /var/lib/postgresql/data
chroot "$r" install -d -o postgres -g postgres -m 3775 /run/postgresql
