// What the wire format costs an EndpointSlice write and a pod event's
// delivery: JSON (portwise: kube-rs and k8s-openapi) against protobuf
// (client-go). See ./run.
//
// Its own module, so that the control plane's go.mod (and its build
// stamp) stay as they are.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// cpuTicks is the process's user + system CPU in clock ticks, 10 ms each
// (USER_HZ is 100 on Linux).
func cpuTicks(pid string) int64 {
	b, _ := os.ReadFile("/proc/" + pid + "/stat")
	s := string(b)
	f := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return u + k
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func main() {
	kc, pid := os.Args[1], os.Args[2]
	n, _ := strconv.Atoi(os.Args[3])
	ctx := context.Background()
	clients := map[string]*kubernetes.Clientset{}
	for _, f := range []string{"json", "protobuf"} {
		cfg, err := clientcmd.BuildConfigFromFlags("", kc)
		must(err)
		cfg.QPS, cfg.Burst = 10000, 10000
		if f == "json" {
			cfg.ContentType = "application/json"
			cfg.AcceptContentTypes = "application/json"
		} else {
			cfg.ContentType = "application/vnd.kubernetes.protobuf"
			cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf"
		}
		c, err := kubernetes.NewForConfig(cfg)
		must(err)
		clients[f] = c
	}
	c := clients["json"]
	_, _ = c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "wire"}}, metav1.CreateOptions{})
	port, proto, name := int32(8080), corev1.ProtocolTCP, "http"
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "s", Labels: map[string]string{"kubernetes.io/service-name": "web"}}, AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}}}
	for i := 0; i < 10; i++ {
		r, node := true, fmt.Sprintf("node-%d", i)
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.99.%d", i+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: &r, Serving: &r, Terminating: new(bool)}, NodeName: &node,
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "wire", Name: fmt.Sprintf("p%d", i), UID: types.UID("00000000-0000-0000-0000-00000000000" + strconv.Itoa(i))}})
	}
	_ = c.DiscoveryV1().EndpointSlices("wire").Delete(ctx, "s", metav1.DeleteOptions{})
	cur, err := c.DiscoveryV1().EndpointSlices("wire").Create(ctx, s, metav1.CreateOptions{})
	must(err)
	rt := map[string][]float64{}
	ticks := map[string]int64{}
	const block = 50
	for done := 0; done < n; done += block {
		for _, f := range []string{"json", "protobuf"} {
			api := clients[f].DiscoveryV1().EndpointSlices("wire")
			t0 := cpuTicks(pid)
			for i := 0; i < block; i++ {
				r := !*cur.Endpoints[0].Conditions.Ready
				cur.Endpoints[0].Conditions.Ready = &r
				st := time.Now()
				cur, err = api.Update(ctx, cur, metav1.UpdateOptions{})
				must(err)
				rt[f] = append(rt[f], float64(time.Since(st).Microseconds())/1000)
			}
			ticks[f] += cpuTicks(pid) - t0
		}
	}
	watchDelivery(ctx, clients, n/2)
	for _, f := range []string{"json", "protobuf"} {
		v := rt[f]
		sort.Float64s(v)
		fmt.Printf("%-8s updates %d  round trip p50 %.2f ms p90 %.2f ms  apiserver CPU per update %.2f ms\n",
			f, len(v), v[len(v)/2], v[len(v)*9/10], float64(ticks[f])*10/float64(len(v)))
	}
}

// watchDelivery times a pod status change from just before its PATCH is
// sent to its arrival on a pod watch in each format, one watch open at a
// time, in alternating blocks of 25: the way in for a controller.
func watchDelivery(ctx context.Context, clients map[string]*kubernetes.Clientset, n int) {
	c := clients["json"]
	pods := c.CoreV1().Pods("wire")
	_ = pods.Delete(ctx, "w", metav1.DeleteOptions{})
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w", Annotations: map[string]string{"port-mapper.example.com/group": "g"}},
		Spec: corev1.PodSpec{NodeName: "node-0", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	_, err := pods.Create(ctx, p, metav1.CreateOptions{})
	must(err)
	lat := map[string][]float64{}
	const block = 25
	ready := false
	for done := 0; done < n; done += block {
		for _, f := range []string{"json", "protobuf"} {
			w, err := clients[f].CoreV1().Pods("wire").Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=w"})
			must(err)
			// The watch's opening event (the pod as it is).
			<-w.ResultChan()
			// Stamped as they arrive: an event may come before the PATCH's
			// response does.
			arrived := make(chan time.Time, block)
			go func() {
				for range w.ResultChan() {
					arrived <- time.Now()
				}
			}()
			for i := 0; i < block; i++ {
				ready = !ready
				status := "False"
				if ready {
					status = "True"
				}
				body := fmt.Sprintf(`{"status":{"podIP":"10.244.99.50","conditions":[{"type":"Ready","status":%q}]}}`, status)
				st := time.Now()
				_, err := pods.Patch(ctx, "w", types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}, "status")
				must(err)
				at := <-arrived
				lat[f] = append(lat[f], float64(at.Sub(st).Microseconds())/1000)
			}
			w.Stop()
		}
	}
	for _, f := range []string{"json", "protobuf"} {
		v := lat[f]
		sort.Float64s(v)
		fmt.Printf("%-8s pod changes %d  PATCH sent → event on the watch p50 %.2f ms p90 %.2f ms\n",
			f, len(v), v[len(v)/2], v[len(v)*9/10])
	}
}
