# The mmdebstrap customize hook of scripts/service-images.sh (its text is
# passed as the hook, run by sh with the rootfs as $1). What the images need
# beyond Debian's packages: no data left by the packages' postinst (Debian's
# main cluster, mariadb's datadir), the official images' en_US.UTF-8 locale
# and run and data directories, valkey's names for the redis programs, and
# mariadb listening on every IPv4 address without name resolution, as the
# official image's docker.cnf does.
set -e
r=$1
rm -rf "$r/var/lib/postgresql/15" "$r/etc/postgresql/15" "$r/var/lib/mysql"
chroot "$r" localedef -i en_US -c -f UTF-8 en_US.UTF-8
chroot "$r" install -d -o postgres -g postgres -m 1777 /var/lib/postgresql/data
chroot "$r" install -d -o postgres -g postgres -m 3775 /run/postgresql
chroot "$r" install -d -o mysql -g mysql -m 0755 /var/lib/mysql
chroot "$r" install -d -o mysql -g mysql -m 1777 /run/mysqld
chroot "$r" install -d -o redis -g redis -m 0755 /data
ln -s redis-server "$r/usr/bin/valkey-server"
ln -s redis-cli "$r/usr/bin/valkey-cli"
printf '[mariadb]\nbind-address = 0.0.0.0\nskip-name-resolve\nhost-cache-size = 0\n' \
    >"$r/etc/mysql/mariadb.conf.d/99-docker.cnf"
