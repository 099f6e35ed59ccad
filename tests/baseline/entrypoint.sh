#!/bin/bash
# The classic desktop entrypoint Dormouse is measured against: a preparation
# script that starts the services in the background with fixed sleeps and
# then parks PID 1 in `exec sleep infinity`. It is deliberately typical, not a
# straw man: it even clears the X lock (naively, on every start) so that it
# does come back after a kill, which many such scripts do not.
#
# Same image, same display, same size and the same services as the Dormouse
# supervisor runs: Xvfb :1 1280x800x24, openbox, x11vnc on loopback.
export DISPLAY=:1

# ---- prepare ----------------------------------------------------------------
rm -f /tmp/.X1-lock /tmp/.X11-unix/X1
mkdir -p /tmp/.X11-unix
chmod 1777 /tmp/.X11-unix
mkdir -p /home/desk/workspace
chown -R desk:desk /home/desk

# ---- services, one fixed sleep each ------------------------------------------
runuser -u desk -- Xvfb :1 -screen 0 1280x800x24 -nolisten tcp >/tmp/xvfb.log 2>&1 &
sleep 2
runuser -u desk -- env DISPLAY=:1 openbox >/tmp/openbox.log 2>&1 &
sleep 1
runuser -u desk -- x11vnc -display :1 -localhost -rfbport 5900 -forever -shared -nopw \
  >/tmp/x11vnc.log 2>&1 &
sleep 1

# ---- park PID 1 ----------------------------------------------------------------
# `sleep` as PID 1 ignores SIGTERM, so `docker stop` waits out its timeout and
# ends everything with SIGKILL (exit code 137).
exec sleep infinity
