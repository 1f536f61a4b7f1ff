"""A production deployment on hosts of your own: systemd units, environment files and
install scripts for nats-server and `pulse up` (`pulse nats-config --systemd`)."""
