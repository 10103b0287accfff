package main

// netns-forward: TCP forwarders whose listening sockets live inside other network namespaces,
// while their outgoing connections are made from this process's own namespace; and the way
// back, an HTTP CONNECT proxy for the API server whose connections are made from inside a
// namespace.
//
//	k8s netns-forward --target 127.0.0.1:6443 /var/run/netns/fabric=10.96.0.1:443 ...
//	k8s netns-forward --connect-proxy /path/proxy.sock --connect-netns /var/run/netns/fabric
//
// The local cluster's API server listens on 127.0.0.1 of the root namespace. Real nodes, CoreDNS
// and pods live in namespaces the driver creates, and nothing routes or NATs between those and
// the root namespace. Each LISTEN argument opens a socket inside a namespace (setns on a locked
// thread, socket, setns back) and forwards every connection to --target. TLS passes through
// untouched, so clients still verify the API server's certificate (its SANs include the
// addresses listened on).

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// inNetns runs open on this goroutine's thread switched into the network namespace at nsPath,
// then switches the thread back: the socket that open makes stays in that namespace. A thread
// that could not be switched back is not reused; it dies with this goroutine.
func inNetns[T io.Closer](nsPath string, open func() (T, error)) (T, error) {
	var none T
	runtime.LockOSThread()
	restored := false
	defer func() {
		if restored {
			runtime.UnlockOSThread()
		}
	}()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return none, err
	}
	defer orig.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		return none, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return none, fmt.Errorf("setns %s: %w", nsPath, err)
	}
	sock, openErr := open()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		if openErr == nil {
			sock.Close()
		}
		return none, fmt.Errorf("setns back from %s: %w", nsPath, err)
	}
	restored = true
	return sock, openErr
}

// listenIn opens a TCP listener inside the network namespace at nsPath.
func listenIn(nsPath, addr string) (net.Listener, error) {
	return inNetns(nsPath, func() (net.Listener, error) { return net.Listen("tcp", addr) })
}

// dialIn connects to addr from inside the network namespace at nsPath.
func dialIn(nsPath, addr string) (net.Conn, error) {
	return inNetns(nsPath, func() (net.Conn, error) {
		return net.DialTimeout("tcp", addr, 5*time.Second)
	})
}

// serveConnect is the API server's egress for "cluster" traffic (kubelets: logs, exec,
// port-forward; pods and services through the proxy subresources): the API server lives in the
// root namespace, which has no route to the nodes, so it asks this proxy (an
// EgressSelectorConfiguration with proxyProtocol HTTPConnect over a Unix socket) to connect
// from inside the fabric namespace.
func serveConnect(listener net.Listener, nsPath string) {
	for {
		conn, err := listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			log.Printf("accept on %s: %v", listener.Addr(), err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go func() {
			defer conn.Close()
			reader := bufio.NewReader(conn)
			req, err := http.ReadRequest(reader)
			if err != nil || req.Method != http.MethodConnect {
				fmt.Fprint(conn, "HTTP/1.1 400 Bad Request\r\n\r\n")
				return
			}
			upstream, err := dialIn(nsPath, req.Host)
			if err != nil {
				log.Printf("connect %s in %s: %v", req.Host, nsPath, err)
				fmt.Fprint(conn, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
				return
			}
			defer upstream.Close()
			fmt.Fprint(conn, "HTTP/1.1 200 Connection established\r\n\r\n")
			if n := reader.Buffered(); n > 0 { // bytes the client sent after its request
				buffered, _ := reader.Peek(n)
				if _, err := upstream.Write(buffered); err != nil {
					return
				}
			}
			var wg sync.WaitGroup
			wg.Add(2)
			go pipe(upstream, conn, &wg)
			go pipe(conn, upstream, &wg)
			wg.Wait()
		}()
	}
}

func pipe(dst, src net.Conn, wg *sync.WaitGroup) {
	defer wg.Done()
	_, _ = io.Copy(dst, src)
	if tcp, ok := dst.(*net.TCPConn); ok {
		_ = tcp.CloseWrite()
	}
}

func serve(listener net.Listener, target string) {
	for {
		conn, err := listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			log.Printf("accept on %s: %v", listener.Addr(), err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go func() {
			defer conn.Close()
			upstream, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				log.Printf("dial %s: %v", target, err)
				return
			}
			defer upstream.Close()
			var wg sync.WaitGroup
			wg.Add(2)
			go pipe(upstream, conn, &wg)
			go pipe(conn, upstream, &wg)
			wg.Wait()
		}()
	}
}

func netnsForwardCommand() int {
	fs := flag.NewFlagSet("netns-forward", flag.ContinueOnError)
	target := fs.String("target", "", "HOST:PORT to forward to, reached from this process's namespace")
	connectSocket := fs.String("connect-proxy", "", "Unix socket of an HTTP CONNECT proxy")
	connectNetns := fs.String("connect-netns", "", "namespace the CONNECT proxy dials from")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *connectSocket != "" {
		if *connectNetns == "" {
			fmt.Fprintln(os.Stderr, "netns-forward: --connect-proxy needs --connect-netns")
			return 2
		}
		_ = os.Remove(*connectSocket)
		listener, err := net.Listen("unix", *connectSocket)
		if err != nil {
			fmt.Fprintf(os.Stderr, "netns-forward: listen on %s: %v\n", *connectSocket, err)
			return 1
		}
		log.Printf("CONNECT proxy on %s, dialing from %s", *connectSocket, *connectNetns)
		go serveConnect(listener, *connectNetns)
	}
	if (fs.NArg() > 0 && *target == "") || (fs.NArg() == 0 && *connectSocket == "") {
		fmt.Fprintln(os.Stderr, "usage: netns-forward --target HOST:PORT NETNS_PATH=ADDR:PORT ...\n"+
			"       netns-forward --connect-proxy SOCKET --connect-netns NETNS_PATH")
		return 2
	}
	for _, arg := range fs.Args() {
		nsPath, addr, ok := strings.Cut(arg, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "netns-forward: expected NETNS_PATH=ADDR:PORT, got %q\n", arg)
			return 2
		}
		listener, err := listenIn(nsPath, addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "netns-forward: listen on %s in %s: %v\n", addr, nsPath, err)
			return 1
		}
		log.Printf("forwarding %s (in %s) to %s", addr, nsPath, *target)
		go serve(listener, *target)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	if *connectSocket != "" {
		_ = os.Remove(*connectSocket)
	}
	return 0
}
