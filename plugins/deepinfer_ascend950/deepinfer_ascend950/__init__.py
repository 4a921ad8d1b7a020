"""DeepInfer's Huawei Ascend 950 platform ``ascend950`` through torch_npu.

``torch_npu`` is imported lazily, inside the availability probe and the ops, so installing this
package on a machine without it changes nothing else.
"""
