"""Models built on GroupNorm, for `kiln compare` and bench/ab_binaries.py by module:function
(PYTHONPATH=bench): torchvision's ResNet-50 with GroupNorm(32) in place of BatchNorm (the
detection backbones' "ResNet-50-GN"), and the residual blocks of a diffusion model's UNet
(GroupNorm(32) + SiLU before each 3x3 convolution). Random weights."""
from __future__ import annotations


def resnet50_gn():
    import torch
    import torchvision

    return torchvision.models.resnet50(weights=None, norm_layer=lambda channels: torch.nn.GroupNorm(32, channels))


def unet_blocks():
    import torch
    from torch import nn

    class ResBlock(nn.Module):
        def __init__(self, cin: int, cout: int):
            super().__init__()
            self.norm1, self.conv1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
            self.norm2, self.conv2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x):
            h = self.conv1(nn.functional.silu(self.norm1(x)))
            h = self.conv2(nn.functional.silu(self.norm2(h)))
            return self.skip(x) + h

    class Blocks(nn.Module):
        """The input at 64x64: 128 channels, then 256 at 32x32 and 512 at 16x16, two blocks each."""

        def __init__(self):
            super().__init__()
            layers = [nn.Conv2d(3, 128, 3, padding=1)]
            cin = 128
            for i, width in enumerate((128, 256, 512)):
                if i:
                    layers.append(nn.Conv2d(cin, cin, 3, stride=2, padding=1))
                layers += [ResBlock(cin, width), ResBlock(width, width)]
                cin = width
            layers += [nn.GroupNorm(32, cin), nn.SiLU(), nn.Conv2d(cin, 4, 3, padding=1)]
            self.body = nn.Sequential(*layers)

        def forward(self, x):
            return self.body(x)

    torch.manual_seed(0)
    return Blocks()
