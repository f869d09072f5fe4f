"""Reads every GPU's slowdown state straight from NVML (ctypes), to hold the agent's
`throttle` findings against: the clock-event reason bits every 0.1 s, GPU and HBM
temperature, SM clock, and the cumulative counters NVML keeps (violation times per
policy; the clock-event reason counters, field ids read from the nvml.h found on
the host). Usage: nvml_thermal.py SECONDS OUT.json; SIGTERM ends it early.
Prints one summary line per GPU."""
import ctypes, glob, json, re, signal, sys, time

nv = ctypes.CDLL("libnvidia-ml.so.1"); nv.nvmlInit_v2()
n = ctypes.c_uint(); nv.nvmlDeviceGetCount_v2(ctypes.byref(n))
devs = []
for i in range(n.value):
    h = ctypes.c_void_p(); nv.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)); devs.append(h)

class FieldValue(ctypes.Structure):
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                ("value", ctypes.c_ulonglong)]

class Violation(ctypes.Structure):
    _fields_ = [("referenceTime", ctypes.c_ulonglong), ("violationTime", ctypes.c_ulonglong)]

# Field ids from the host's header, so that no number is guessed here.
FIELDS = {"MEMORY_TEMP": 82}
for hdr in glob.glob("/usr/local/cuda*/include/nvml.h") + glob.glob("/opt/torch/.venv/lib/python3*/site-packages/nvidia/*/include/nvml.h"):
    for name, num in re.findall(r"#define\s+NVML_FI_DEV_(CLOCKS_EVENT_REASON_\w+|MEMORY_TEMP)\s+(\d+)", open(hdr).read()):
        FIELDS[name] = int(num)
    break
POLICIES = {"power": 0, "thermal": 1, "sync_boost": 2, "board_limit": 3, "low_util": 4, "reliability": 5}

def fields(h):
    ids = list(FIELDS.items())
    arr = (FieldValue * len(ids))()
    for k, (_, fid) in enumerate(ids):
        arr[k].fieldId = fid
    nv.nvmlDeviceGetFieldValues(h, len(ids), arr)
    return {name: (arr[k].value if arr[k].nvmlReturn == 0 else None) for k, (name, _) in enumerate(ids)}

def violations(h):
    out = {}
    for name, p in POLICIES.items():
        v = Violation(); rc = nv.nvmlDeviceGetViolationStatus(h, p, ctypes.byref(v))
        out[name] = v.violationTime if rc == 0 else None
    return out

def counters():
    return [{"t": time.time(), "fields": fields(h), "violation_ns": violations(h)} for h in devs]

dur, out = float(sys.argv[1]), sys.argv[2]
def _stop(*a):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, _stop)
first = counters(); rows = []; t0 = time.time()
try:
    while time.time() - t0 < dur:
        t = round(time.time() - t0, 2)
        for i, h in enumerate(devs):
            r = ctypes.c_ulonglong(0); nv.nvmlDeviceGetCurrentClocksEventReasons(h, ctypes.byref(r))
            temp = ctypes.c_uint(0); nv.nvmlDeviceGetTemperature(h, 0, ctypes.byref(temp))
            clk = ctypes.c_uint(0); nv.nvmlDeviceGetClockInfo(h, 1, ctypes.byref(clk))
            util = (ctypes.c_uint * 2)(); nv.nvmlDeviceGetUtilizationRates(h, util)
            mem = fields(h).get("MEMORY_TEMP") if int(t * 10) % 5 == 0 else None
            rows.append({"t": t, "gpu": i, "reasons": r.value, "temp": temp.value, "mem_temp": mem,
                         "sm_mhz": clk.value, "util": util[0]})
        time.sleep(0.1)
except KeyboardInterrupt:
    pass
last = counters()
json.dump({"fields": FIELDS, "first": first, "last": last, "rows": rows}, open(out, "w"))
wall = last[0]["t"] - first[0]["t"]
for i in range(len(devs)):
    r = [x for x in rows if x["gpu"] == i]
    loaded = [x for x in r if x["util"] >= 50] or [{"reasons": 0}]
    share = lambda bit: sum(1 for x in loaded if x["reasons"] & bit) / len(loaded)
    mems = [x["mem_temp"] for x in r if x["mem_temp"] is not None]
    vio = {k: (last[i]["violation_ns"][k] - first[i]["violation_ns"][k]) / 1e9 if first[i]["violation_ns"][k] is not None else None
           for k in POLICIES}
    cnt = {k.replace("CLOCKS_EVENT_REASON_", "").lower(): (last[i]["fields"][k] - first[i]["fields"][k]) / 1e9
           if first[i]["fields"].get(k) is not None and last[i]["fields"].get(k) is not None else None
           for k in FIELDS if k.startswith("CLOCKS_EVENT")}
    print(f"GPU {i}: {len(r)} samples, {len(loaded)} loaded; loaded share hw_slowdown {share(0x08):.3f} "
          f"sw_thermal {share(0x20):.3f} hw_thermal {share(0x40):.3f} power_brake {share(0x80):.3f} sw_power {share(0x04):.3f}; "
          f"temp max {max((x['temp'] for x in r), default=0)} C, hbm max {max(mems, default=None)} C; "
          f"over {wall:.0f} s: violation s {json.dumps(vio)}; clock-event counters s {json.dumps(cnt)}")
